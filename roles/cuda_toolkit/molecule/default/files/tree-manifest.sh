#!/bin/sh
# Manifest of a directory tree for a byte-for-byte comparison: every entry's type, mode, owner,
# size, mtime and link target, then the sha256 of every regular file. Usage: tree-manifest.sh DIR
set -eu
cd "$1"
find . -printf '%y %m %u:%g %s %T@ %p -> %l\n' | LC_ALL=C sort
find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
