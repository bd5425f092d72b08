#!/bin/bash
# Instructions per iteration of the hot paths the benchmark's stable rows time, for this
# checkout against an earlier one, counted by valgrind's callgrind. Unlike a criterion time
# this does not move with the neighbours' load on a shared machine, so it tells a code
# regression from noise. Needs valgrind.
#
#   bash tests/instructions/count.sh 3dd7e118
#
# Each path runs 200,000 and 400,000 times; the difference of the two totals over 200,000
# is the cost of one iteration with the program's start-up cancelled out.
set -euo pipefail
old_rev=${1:?usage: count.sh OLD_REV}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=${COUNT_DIR:-${TMPDIR:-/tmp}/throttle-instructions}
mkdir -p "$work"
if [ ! -d "$work/old-tree" ]; then
  git -C "$here" worktree add -q --detach "$work/old-tree" "$old_rev"
else
  git -C "$work/old-tree" checkout -q --detach "$old_rev"
fi
for v in old new; do
  core=$([ $v = old ] && echo "$work/old-tree/throttle-core" || echo "$here/throttle-core")
  # The core's package was `throttle-core` before issue 13 renamed it: import it by either name.
  pkg=$(sed -n 's/^name = "\(.*\)"/\1/p' "$core/Cargo.toml" | head -1)
  mkdir -p "$work/$v/src"
  cp "$here/tests/instructions/harness.rs" "$work/$v/src/main.rs"
  cp "$here/tests/support/fx_hasher.rs" "$work/$v/src/fx_hasher.rs"
  cat > "$work/$v/Cargo.toml" <<TOML
[package]
name = "count-$v"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
throttle-sansio = { package = "$pkg", path = "$core", features = ["std"] }
[profile.release]
debug = 1
[workspace]
TOML
  (cd "$work/$v" && CARGO_TARGET_DIR="$work/target-$v" cargo build --release -q)
done
refs() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | sed -n 's/.*refs: *//p' | tr -d ','; }
declare -A row=([permit_idle]="permit through sync" [permit_busy]="permit through sync (busy shard)"
  [permit_fx]="permit through sync (FxHash)" [permit_borrowed]="permit through sync (borrowed)"
  [window_idle]="window credit, uncontended" [window_busy]="window credit, uncontended (busy shard)"
  [backoff]="backoff with jitter")
printf '| path | benchmark row | %s | this checkout | change |\n| --- | --- | --- | --- | --- |\n' "$old_rev"
for mode in permit_idle permit_busy permit_fx permit_borrowed window_idle window_busy backoff; do
  declare -A per
  for v in old new; do
    bin="$work/target-$v/release/count-$v"
    a=$(refs "$bin" 200000 "$mode"); b=$(refs "$bin" 400000 "$mode")
    per[$v]=$(( (b - a) / 200000 ))
  done
  printf '| %s | %s | %d | %d | %+.1f %% |\n' "$mode" "${row[$mode]}" "${per[old]}" "${per[new]}" \
    "$(echo "scale=3; (${per[new]} - ${per[old]}) * 100 / ${per[old]}" | bc)"
done
