"""Logging of the ``changelake`` command: text for a terminal, or one JSON object per line.

JSON lines use the field names of Spark 4's own structured logs (``ts``, ``level``, ``logger``,
``msg``, ``exception``), so one log pipeline reads both the service's and Spark's lines.

With ``--log-format json`` every line the process and its children write to standard error is one
JSON object (:class:`JsonStderr`):

    writer                                   how its lines become JSON
    the service's loggers, warnings          JsonFormatter (warnings through logging.captureWarnings)
    Spark's JVM (log4j)                      Spark's own JSON layout (spark.log.structuredLogging.enabled,
                                             set by the runner); a line it still prints as text: as below
    Python workers, librdkafka, anything     the stderr pipe: a line that is not a JSON object becomes
                                             {"ts", "level", "logger": "stderr", "msg"}; indented lines,
                                             "at ..." and "Caused by: ..." join the line before them
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import select
import sys
import threading
from typing import Callable

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601, ms), level, logger, msg, and exception
    (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text", *, whole_process: bool = False) -> None:
    """Log to stderr at ``level`` in ``log_format``; py4j stays at WARNING because at DEBUG it logs
    every command sent to the JVM, Kafka credentials in reader options included. ``whole_process`` (the
    CLI): in json, also what the process's children and libraries write to stderr (:class:`JsonStderr`)."""
    global _FORMAT
    _FORMAT = log_format
    if whole_process:
        JsonStderr.install() if log_format == "json" else JsonStderr.uninstall()
    logging.captureWarnings(log_format == "json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_changelake", False)]:
        root.removeHandler(old)
    handler._changelake = True          # type: ignore[attr-defined]  # replaced, not stacked, on a second call
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("py4j").setLevel(logging.WARNING)


_FORMAT = "text"


def log_format() -> str:
    """The format the process logs in (``text`` or ``json``)."""
    return _FORMAT


#: a log4j text line: "26/11/28 09:07:22 ERROR Executor: message"
_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ([\w$.]+): (.*)$")
#: a Python warning: "/path/file.py:12: UserWarning: message"
_WARNING = re.compile(r"^\S+:\d+: (\w+Warning): (.*)$")
_CONTINUATION = re.compile(r"^(\s|at |Caused by: |\.\.\. \d+ more|During handling|The above exception)")
#: the last line of a Python traceback: "ValueError: bad value"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Warning|Interrupt|Exit)\b")
_LEVELS = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def stderr_record(line: str, more: list[str]) -> str:
    """The JSON object (one line) for a text line written to stderr and its continuation lines."""
    level, logger, msg = "INFO", "stderr", line
    if m := _LOG4J.match(line):
        level, logger, msg = _LEVELS.get(m.group(1), m.group(1)), m.group(2), m.group(3)
    elif m := _WARNING.match(line):
        level, logger = "WARNING", f"py.warnings.{m.group(1)}"
    elif line.startswith("changelake: "):               # the CLI's one-line error
        level, logger, msg = "ERROR", "changelake", line[len("changelake: "):]
    elif line.startswith(("ERROR", "Traceback")):
        level = "ERROR"
    out = {"ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"), "level": level,
           "logger": logger, "msg": msg}
    if more:
        out["exception"] = "\n".join(more)
    return json.dumps(out, ensure_ascii=False)


def is_json_object(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class _Fd2Pipe:
    """File descriptor 2 as the write end of a pipe, read by a thread (``_pump``) that writes to the real
    stderr. Children started afterwards (Spark's JVM, its Python workers) inherit the pipe; one at a time
    per subclass, given back at exit (or by :meth:`uninstall`)."""

    _active: "_Fd2Pipe | None" = None

    def __init__(self) -> None:
        sys.stderr.flush()
        self.real = os.dup(2)
        self.read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._opened()
        self.thread = threading.Thread(target=self._pump, name=f"changelake-{type(self).__name__}", daemon=True)
        self.thread.start()

    @classmethod
    def install(cls) -> "_Fd2Pipe":
        if cls._active is None:
            cls._active = cls()
            import atexit
            atexit.register(cls.uninstall)
        return cls._active

    @classmethod
    def uninstall(cls) -> None:
        active, cls._active = cls._active, None
        if active is not None:
            active.close()

    def close(self) -> None:
        """Give fd 2 back; what is in the pipe is written first (children that still hold it end later)."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.real, 2)
        self.thread.join(timeout=1.0)

    def _opened(self) -> None:
        """Runs once ``real`` (the real stderr) is there, before the pump starts."""

    def _pump(self) -> None:
        raise NotImplementedError

    def _read_lines(self, on_line: Callable[[str], None], on_idle: Callable[[bytes], bytes]) -> bytes:
        """Read the pipe until every writer closed it: ``on_line`` gets each whole line (decoded, without its
        ``\\r``); ``on_idle`` gets the unfinished line after ``LINGER_S`` without data and returns what to
        keep of it. Returns what is left after the last newline."""
        buffer = b""
        while True:
            ready, _, _ = select.select([self.read_fd], [], [], self.LINGER_S)
            if not ready:
                buffer = on_idle(buffer)
                continue
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                return buffer
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                on_line(raw.decode("utf-8", errors="replace").rstrip("\r"))


class TerminalStderr(_Fd2Pipe):
    """A status line (the catch-up progress) at the bottom of a terminal, and every line written to file
    descriptor 2 above it: Spark's JVM (log4j), its Python workers and librdkafka write to fd 2 directly,
    past Python's log handlers, and a line of theirs would otherwise land on the end of the status line.

        writer                            what reaches the terminal
        show(line)                        "\\r" + clear-to-end-of-line + line (no newline: redrawn in place)
        a line written to fd 2            clear the status line, the line, then the status line again
        end()                             a newline after the status line, which stays; no status line after
    """

    _active: "TerminalStderr | None" = None
    #: seconds a line without its newline waits before it is written as a line of its own
    LINGER_S = 0.5
    CLEAR = "\r\x1b[K"

    def __init__(self) -> None:
        self.status = ""
        self._lock = threading.Lock()
        super().__init__()

    def _opened(self) -> None:
        self.out = os.fdopen(os.dup(self.real), "w", buffering=1, encoding="utf-8", errors="replace")

    def show(self, line: str) -> None:
        with self._lock:
            self.status = line
            self.out.write(self.CLEAR + line)
            self.out.flush()

    def end(self) -> None:
        with self._lock:
            if self.status:
                self.out.write("\n")
                self.out.flush()
            self.status = ""

    def _write_line(self, line: str) -> None:
        with self._lock:
            if self.status:
                self.out.write(self.CLEAR)
            self.out.write(line + "\n")
            if self.status:
                self.out.write(self.status)
            self.out.flush()

    def _pump(self) -> None:
        def idle(buffer: bytes) -> bytes:
            if buffer:                  # a prompt or a line still being written: shown, not held back
                self._write_line(buffer.decode("utf-8", errors="replace"))
            return b""

        buffer = self._read_lines(self._write_line, idle)
        if buffer:
            self._write_line(buffer.decode("utf-8", errors="replace"))


class JsonStderr(_Fd2Pipe):
    """File descriptor 2 through a pipe whose reader writes one JSON object per line to the real stderr
    (see the module's table). Children started afterwards (Spark's JVM, its Python workers) inherit the pipe."""

    _active: "JsonStderr | None" = None
    #: seconds a line waits for continuation lines before it is written
    LINGER_S = 0.2

    def _pump(self) -> None:
        pending: str | None = None
        more: list[str] = []
        out = os.fdopen(os.dup(self.real), "w", buffering=1, encoding="utf-8", errors="replace")

        def flush() -> None:
            nonlocal pending, more
            if pending is not None:
                out.write(stderr_record(pending, more) + "\n")
            pending, more = None, []

        def take(line: str) -> None:
            nonlocal pending
            if not line.strip():
                return
            if is_json_object(line):
                flush()
                out.write(line + "\n")
            elif pending is not None and (_CONTINUATION.match(line) or (
                    pending.startswith("Traceback") and _EXCEPTION_LINE.match(line))):
                more.append(line)
            else:
                flush()
                pending = line

        def idle(buffer: bytes) -> bytes:
            flush()
            return buffer

        buffer = self._read_lines(take, idle)
        if buffer.strip():
            line = buffer.decode("utf-8", errors="replace")
            if is_json_object(line):
                flush()
                out.write(line + "\n")
            else:
                more.append(line) if pending is not None else None
                pending = pending if pending is not None else line
        flush()
        out.close()
