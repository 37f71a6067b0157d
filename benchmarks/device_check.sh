#!/usr/bin/env bash
# The check after the last change to GPU code (README "Install"; the developers' guide): the GPU
# suite and then the benchmarks, in one command on a GPU machine.  Everything lands in one folder
# and one tarball (the device tool returns at most 8 files):
#
#     OUT=/some/dir bash benchmarks/device_check.sh      # -> $OUT/device_check.tgz
#
# JOBS: pytest-xdist workers for the suite (default 4; 0 runs it in one process); FUZZ: GPU fuzz
# examples (default 10000; 0 skips it); BUDGET_S: the whole run's limit (default 530 s, under the
# device tool's 540): bench_conv --quick and host_overhead, last, run only while that leaves room
# for their own 60 s limits.  BENCH_GIT_COMMIT=$(git rev-parse HEAD), set where the tree was copied
# from, stamps every JSON when the copy has no .git (benchmarks/_common.py run_stamp).  The summary
# lines are printed as they come.  Exit status: the GPU suite's (non-zero when it failed or timed
# out), else the GPU fuzz run's.  Only JSON written during this run lands in the tarball.
set -u
OUT=${OUT:-benchmarks/results/device_check}
RES=$(mktemp -d)/device_check
mkdir -p "$RES" "$OUT"
JOBS=${JOBS:-4}
FUZZ=${FUZZ:-10000}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$RES/device.txt"
started=$(date +%s)
BUDGET_S=${BUDGET_S:-530}
touch "$RES/.started"  # what is newer was written by this run
pack() { tar czf "$OUT/device_check.tgz" -C "$(dirname "$RES")" device_check; }  # after every step: a cut-off run keeps what it did

xdist=()
[ "$JOBS" != 0 ] && xdist=(-n "$JOBS" --dist loadfile)
timeout "${SUITE_S:-330}" python3 -m pytest tests -m gpu "${xdist[@]}" -p no:cacheprovider -o addopts="" -q -rfE \
    > "$RES/pytest_gpu.log" 2>&1
suite_rc=$?
echo "pytest rc=$suite_rc ($(( $(date +%s) - started )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$RES/pytest_gpu.log" | tail -30
pack

run() {  # name, timeout, command...
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    timeout "$limit" "$@" > "$RES/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($(( $(date +%s) - t0 )) s)"
    pack
    return $rc
}
run_if_time() {  # name, timeout, command...: only when the run stays under BUDGET_S
    local left=$(( BUDGET_S - ($(date +%s) - started) ))
    if [ "$left" -lt "$2" ]; then
        echo "$1 skipped: ${left} s left of BUDGET_S=${BUDGET_S}, it may take $2 s"
        return 0
    fi
    run "$@"
}
run bench_programs 240 python3 benchmarks/bench_programs.py --out "$RES"
run bench_memory_bound 90 python3 benchmarks/bench_memory_bound.py --out "$RES"
run bench_attention 90 python3 benchmarks/bench_attention.py --out "$RES"
run bench_conv_zoo 100 python3 benchmarks/bench_conv_zoo.py --out "$RES"
run bench_ctc_sampler 90 python3 benchmarks/bench_ctc_sampler.py --out "$RES"
run fuse_profile 60 python3 benchmarks/fuse_profile.py
run multi_gpu_example 60 env PYTHONPATH=. python3 -m torch.distributed.run --nproc-per-node 1 \
    examples/multi_gpu_data_parallel.py --check
fuzz_rc=0
if [ "$FUZZ" != 0 ]; then
    run fuzz_gpu 120 python3 benchmarks/fuzz_nightly.py --place gpu --examples "$FUZZ" --batch 10 --jobs 14 \
        --json "$RES/fuzz_gpu.json"
    fuzz_rc=$?
fi
# last, while the budget allows: bench_conv's two quick configs (its full run took 42 s on the H100)
# and host_overhead's cached-call costs (2000 calls a case)
run_if_time bench_conv 60 python3 benchmarks/bench_conv.py --quick --out "$RES"
run_if_time host_overhead 60 python3 benchmarks/host_overhead.py --place gpu --calls 2000 \
    --json "$RES/host_overhead_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' _).json"
# only JSON this run wrote: an older host_overhead JSON in benchmarks/results is not this code's
find benchmarks/results -maxdepth 1 -name 'host_overhead_*.json' -newer "$RES/.started" -exec cp {} "$RES/" \;
for f in bench_programs bench_memory_bound bench_attention bench_ctc_sampler fuse_profile multi_gpu_example fuzz_gpu \
         bench_conv host_overhead; do
    [ -f "$RES/$f.log" ] && { echo "== $f"; grep -v -i "warn" "$RES/$f.log" | tail -"${TAIL:-14}"; }
done
rm -f "$RES/.started"
pack
echo "total $(( $(date +%s) - started )) s; wrote $OUT/device_check.tgz"
[ "$suite_rc" != 0 ] && { echo "GPU suite failed (rc=$suite_rc)"; exit "$suite_rc"; }
exit "$fuzz_rc"
