#!/usr/bin/env bash
# Fuzz smoke test: every cargo-fuzz target runs briefly from the checked-in corpus; any crash,
# leak or timeout fails the script. Prints, per target, libFuzzer's final stats line.
#
#   fuzz/smoke.sh                      # every target, 15 s each (.ci/run: 8 s, within its 5 minutes)
#   FUZZ_SMOKE_SECS=60 fuzz/smoke.sh backoff batcher
#
# New inputs go to a scratch directory, so the checked-in corpus is only read.
set -euo pipefail

cd "$(dirname "$0")"
secs="${FUZZ_SMOKE_SECS:-15}"
runs="${FUZZ_SMOKE_RUNS:-2000000}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# AddressSanitizer needs nightly. Without nightly, build on the toolchain there is with `-s none`
# (works on stable): coverage guidance, overflow checks and the checkers' asserts remain.
toolchain=()
sanitizer=()
if rustup run nightly rustc --version >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    echo "smoke: no nightly toolchain; building with the default one and -s none" >&2
    sanitizer=(-s none)
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list)
fi

cargo "${toolchain[@]}" fuzz build "${sanitizer[@]}"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

failed=()
summary=()
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "corpus/$t"
    log="$scratch/$t.log"
    status=0
    cargo "${toolchain[@]}" fuzz run "${sanitizer[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$secs" -runs="$runs" -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    # The final stats line is libFuzzer's `#N DONE cov: … ft: … corp: …`, then `Done N runs in S s`.
    stats="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true) / $(grep -E '^Done [0-9]+ runs' "$log" | tail -n 1 || true)"
    if [ "$status" -ne 0 ]; then
        echo "smoke: $t FAILED (exit $status); the end of its log:" >&2
        tail -n 40 "$log" >&2
        failed+=("$t")
        summary+=("$t: FAILED (exit $status) $stats")
    else
        summary+=("$t: $stats")
    fi
done

echo "fuzz smoke, ${secs} s per target:"
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "smoke: crashing targets: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
