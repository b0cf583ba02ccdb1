#!/bin/sh
# fetch-jar REPO GROUP ARTIFACT VERSION
# Downloads one jar from a Maven repository into the current directory and
# checks it against the repository's published .sha1 file.
set -eu
repo="$1"; group="$2"; artifact="$3"; version="$4"
jar="${artifact}-${version}.jar"
url="${repo}/$(echo "$group" | tr . /)/${artifact}/${version}/${jar}"
curl -fsSL --retry 3 -o "$jar" "$url"
expected="$(curl -fsSL --retry 3 "${url}.sha1" | cut -c1-40)"
echo "${expected}  ${jar}" | sha1sum -c -
