#!/usr/bin/env bash
# Builds the release tarball: the binary with the dist profile (optimised, stripped), the
# commit embedded, packed with what a user needs beside it.
#
#   docker/release.sh                # from a clean checkout of the commit to release
#   docker/release.sh --allow-dirty  # a local try with uncommitted changes (commit marked -dirty)
#   docker/release.sh --out DIR      # where to write (default: <target dir>/artifacts)
#
# Writes DIR/outbox-relay-<version>-x86_64-unknown-linux-gnu.tar.gz, holding one folder of the
# same name with: outbox-relay (the binary), LICENSE, README.md, CHANGELOG.md, docs/, sql/,
# examples/relay.toml, deploy/ and SHA256SUMS (of those files: `sha256sum -c SHA256SUMS`), and
# DIR/SHA256SUMS of the tarball. The archive is reproducible: its entries are sorted, owned by
# root and dated at the commit's time.
#
# The binary links glibc 2.34 or newer, libssl3 and zlib dynamically: it runs on Debian 12,
# Ubuntu 22.04 and later, RHEL 9 and their kin. The script prints what it needs, from the
# binary itself, at the end. Needs cargo, git, tar, gzip, sha256sum and objdump (binutils).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:$PATH"

ALLOW_DIRTY=0
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
OUT="$TARGET_DIR/artifacts"
while [ $# -gt 0 ]; do
  case "$1" in
    --allow-dirty) ALLOW_DIRTY=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "docker/release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { echo "docker/release.sh: $*"; }
fail() { echo "docker/release.sh: $*" >&2; exit 1; }

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$VERSION" ] || fail "no version = \"...\" line in Cargo.toml"
TRIPLE=x86_64-unknown-linux-gnu
[ "$(uname -m)" = x86_64 ] || fail "builds $TRIPLE only, on an x86_64 host (this is $(uname -m))"

# The commit: OUTBOX_RELAY_COMMIT when set (a tree without .git), else the checkout's HEAD.
if [ -n "${OUTBOX_RELAY_COMMIT:-}" ]; then
  COMMIT=$OUTBOX_RELAY_COMMIT
  EPOCH=${SOURCE_DATE_EPOCH:-$(date +%s)}
else
  COMMIT=$(git rev-parse --short=12 HEAD) || fail "not a git checkout: set OUTBOX_RELAY_COMMIT"
  EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    [ "$ALLOW_DIRTY" = 1 ] || fail "uncommitted changes (git status): commit them, or pass --allow-dirty for a local try"
    COMMIT="$COMMIT-dirty"
  fi
fi
export OUTBOX_RELAY_COMMIT=$COMMIT

say "building outbox-relay $VERSION ($COMMIT) with the dist profile"
start=$SECONDS
cargo build --profile dist --locked --bin outbox-relay
say "built in $((SECONDS - start)) s"
BIN="$TARGET_DIR/dist/outbox-relay"

# The binary must say what it is: `outbox-relay <version> (commit <commit>)`.
printed=$("$BIN" --version)
case "$printed" in
  *" $VERSION (commit $COMMIT)"*) say "--version: $printed" ;;
  *) fail "$BIN --version printed '$printed', want version $VERSION and commit $COMMIT" ;;
esac
if objdump -h "$BIN" | grep -q '\.debug_'; then
  fail "$BIN has debug sections: the dist profile should strip them"
fi

NAME="outbox-relay-$VERSION-$TRIPLE"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
PKG="$STAGE/$NAME"
mkdir -p "$PKG/examples"
install -m 0755 "$BIN" "$PKG/outbox-relay"
cp LICENSE README.md CHANGELOG.md "$PKG/"
cp -r docs sql deploy "$PKG/"
cp examples/relay.toml "$PKG/examples/"
(cd "$PKG" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TARBALL="$NAME.tar.gz"
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
  --mode='u+rwX,go+rX,go-w' -cf - "$NAME" | gzip -n -9 >"$OUT/$TARBALL"
(cd "$OUT" && sha256sum "$TARBALL" >SHA256SUMS)

# What the binary needs on the machine that runs it.
glibc=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -n 1)
libs=$(objdump -p "$BIN" | awk '/NEEDED/ {print $2}' | tr '\n' ' ')
say "binary: $(stat -c %s "$BIN") bytes; needs ${glibc/_/ } or newer; links ${libs% }"
say "wrote $OUT/$TARBALL ($(stat -c %s "$OUT/$TARBALL") bytes) and $OUT/SHA256SUMS"
