#!/usr/bin/env bash
# The check after the last change to GPU code (README "Install"; the developers' guide): the GPU
# suite and then the benchmarks, in one command on a GPU machine.  Everything lands in one folder
# and one tarball (the device tool returns at most 8 files):
#
#     OUT=/some/dir bash benchmarks/device_check.sh      # -> $OUT/device_check.tgz
#
# PART: 1 (default) the GPU suite, then host_overhead, bench_programs (N=32 and N=1 rows) and
# step_split (issue 26's "done when": the suite and those benchmarks in one run), then the others
# as time allows; 2: no suite, the other benchmarks (attention, conv zoo, launch paths, memory
# bound, GPU fuzz, bench_conv, CTC, fuse profile, the multi-GPU example): the suite takes 170-180 s
# and bench_programs 220, so all of it no longer fits one 600 s command.
# JOBS: pytest-xdist workers for the suite (default 8; 0 runs it in one process); FUZZ: GPU fuzz
# examples (default 3000; 0 skips it); BUDGET_S: the whole run's limit (default 560 s, under the
# device tool's 600 s a command): the benchmarks run most needed first, each cut to what is left,
# and skipped when under 25 s is left.  BENCH_GIT_COMMIT=$(git rev-parse HEAD), set where the tree was copied
# from, stamps every JSON when the copy has no .git (benchmarks/_common.py run_stamp).  The summary
# lines are printed as they come.  Exit status: the GPU suite's (non-zero when it failed or timed
# out), else the GPU fuzz run's.  Only JSON written during this run lands in the tarball.
set -u
OUT=${OUT:-benchmarks/results/device_check}
RES=$(mktemp -d)/device_check
mkdir -p "$RES" "$OUT"
JOBS=${JOBS:-8}
FUZZ=${FUZZ:-3000}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$RES/device.txt"
started=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
# the compiled steady path (setup.py: cudnn_compat/_backend/_steady.c) in place, as an install builds it
if python3 setup.py -q build_ext --inplace > "$RES/build_ext.log" 2>&1 && python3 -c "import cudnn_compat._backend._steady"; then
    echo "compiled steady path: built"
else
    echo "compiled steady path: NOT built, the Python twins run (build_ext.log)"
fi
touch "$RES/.started"  # what is newer was written by this run
pack() { tar czf "$OUT/device_check.tgz" -C "$(dirname "$RES")" device_check; }  # after every step: a cut-off run keeps what it did

PART=${PART:-1}
suite_rc=0
if [ "$PART" = 1 ]; then
    xdist=()
    [ "$JOBS" != 0 ] && xdist=(-n "$JOBS" --dist loadfile)
    timeout "${SUITE_S:-300}" python3 -m pytest tests -m gpu "${xdist[@]}" -p no:cacheprovider -o addopts="" -q -rfE \
        > "$RES/pytest_gpu.log" 2>&1
    suite_rc=$?
    echo "pytest rc=$suite_rc ($(( $(date +%s) - started )) s)"
    grep -E "^(FAILED|ERROR)|passed|failed" "$RES/pytest_gpu.log" | tail -30
    pack
fi

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
    local name=$1 limit=$2 left=$(( BUDGET_S - ($(date +%s) - started) ))
    shift 2
    if [ "$left" -lt 25 ]; then
        echo "$name skipped: ${left} s left of BUDGET_S=${BUDGET_S}"
        return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left  # cut to what is left (the step's log says how far it got)
    run "$name" "$limit" "$@"
}
# Every benchmark after the suite, most needed first, each only if it still fits BUDGET_S (the device tool
# allows 600 s a command): a skipped step says so in the summary.
HO_JSON="$RES/host_overhead_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' _).json"
fuzz_rc=0
if [ "$PART" = 1 ]; then
    run_if_time host_overhead 60 python3 benchmarks/host_overhead.py --place gpu --calls 4000 --json "$HO_JSON"
    # bench_programs: the N=32 rows, then the N=1 rows (issue 26 item 8: ours eager / captured, what bounds it; ~45 s a row)
    run_if_time bench_programs 230 python3 benchmarks/bench_programs.py --no-host --batches 32,1 --out "$RES"
    # the N=1 step's host time split: the driver's launch calls (timed by a shim) against our path and the script
    run_if_time step_split 40 python3 benchmarks/step_split.py --steps 30 --out "$RES"
fi
run_if_time bench_attention 80 python3 benchmarks/bench_attention.py --out "$RES"
run_if_time bench_conv_zoo 80 python3 benchmarks/bench_conv_zoo.py --budget 60 --out "$RES"
if [ "$PART" != 1 ]; then
    # the host cost of each way to launch, and the GPU time of CUDA-graph launches (why launch-record graphs are off)
    run_if_time launch_paths 30 python3 benchmarks/launch_paths.py --calls 2000 --json "$RES/launch_paths.json"
    run_if_time bench_memory_bound 70 python3 benchmarks/bench_memory_bound.py --out "$RES"
    if [ "$FUZZ" != 0 ]; then
        run_if_time fuzz_gpu 45 python3 benchmarks/fuzz_nightly.py --place gpu --examples "$FUZZ" --batch 10 --jobs 14 \
            --json "$RES/fuzz_gpu.json"
        fuzz_rc=$?
    fi
    run_if_time bench_conv 50 python3 benchmarks/bench_conv.py --quick --skip host --out "$RES"
    run_if_time bench_ctc_sampler 40 python3 benchmarks/bench_ctc_sampler.py --quick --out "$RES"
    run_if_time fuse_profile 40 python3 benchmarks/fuse_profile.py --quick
    run_if_time multi_gpu_example 40 env PYTHONPATH=. python3 -m torch.distributed.run --nproc-per-node 1 \
        examples/multi_gpu_data_parallel.py --check
fi
find benchmarks/results -maxdepth 1 -name 'host_overhead_*.json' -newer "$RES/.started" -exec cp {} "$RES/" \;
for f in bench_attention bench_conv_zoo bench_programs step_split host_overhead launch_paths bench_memory_bound fuzz_gpu bench_conv \
         bench_ctc_sampler fuse_profile multi_gpu_example; do
    [ -f "$RES/$f.log" ] && { echo "== $f"; grep -v -i "warn" "$RES/$f.log" | tail -"${TAIL:-14}"; }
done
rm -f "$RES/.started"
pack
echo "total $(( $(date +%s) - started )) s; wrote $OUT/device_check.tgz"
[ "$suite_rc" != 0 ] && { echo "GPU suite failed (rc=$suite_rc)"; exit "$suite_rc"; }
exit "$fuzz_rc"
