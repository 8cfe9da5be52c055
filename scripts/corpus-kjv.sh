#!/usr/bin/env bash
# W6's corpus (docs/protocol-41.md): the King James Bible (1611; public domain) as plain text,
# one verse a line, its "Book Chapter:Verse" references stripped. Extracted from Debian's
# bible-kjv-text 4.38 (data) with bible-kjv 4.38's `bible` tool (amd64), both fetched with
# `apt-get download`; nothing is installed. Usage: scripts/corpus-kjv.sh OUT.txt
set -euo pipefail
out=${1:?usage: scripts/corpus-kjv.sh OUT.txt}
want=b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download bible-kjv-text=4.38 bible-kjv=4.38 >/dev/null)
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
"$tmp/root/usr/bin/bible" -p "$tmp/root/usr/lib" -f "Gen1:1-Rev22:21" \
  | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$tmp/kjv.txt"
got=$(sha256sum "$tmp/kjv.txt" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "corpus-kjv: sha256 $got, expected $want" >&2
  exit 1
fi
mv "$tmp/kjv.txt" "$out"
echo "wrote $out ($(wc -c <"$out") bytes, sha256 $got)"
