#!/usr/bin/env bash
# The check after the last change to GPU code (README "Install"; the developers' guide): the GPU
# suite and then the benchmarks, in one command on a GPU machine.  Everything lands in one folder
# and one tarball (the device tool returns at most 8 files):
#
#     OUT=/some/dir bash benchmarks/device_check.sh      # -> $OUT/device_check.tgz
#
# JOBS: pytest-xdist workers for the suite (default 4; 0 runs it in one process); FUZZ: GPU fuzz
# examples (default 10000; 0 skips it).  The summary lines are printed as they come.
set -u
OUT=${OUT:-benchmarks/results/device_check}
RES=$(mktemp -d)/device_check
mkdir -p "$RES" "$OUT"
JOBS=${JOBS:-4}
FUZZ=${FUZZ:-10000}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$RES/device.txt"
started=$(date +%s)
pack() { tar czf "$OUT/device_check.tgz" -C "$(dirname "$RES")" device_check; }  # after every step: a cut-off run keeps what it did

xdist=()
[ "$JOBS" != 0 ] && xdist=(-n "$JOBS" --dist loadfile)
timeout "${SUITE_S:-330}" python3 -m pytest tests -m gpu "${xdist[@]}" -p no:cacheprovider -o addopts="" -q -rfE \
    > "$RES/pytest_gpu.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - started )) s)"
grep -E "^(FAILED|ERROR)|passed|failed" "$RES/pytest_gpu.log" | tail -30
pack

run() {  # name, timeout, command...
    local name=$1 limit=$2
    shift 2
    local t0=$(date +%s)
    timeout "$limit" "$@" > "$RES/$name.log" 2>&1
    echo "$name rc=$? ($(( $(date +%s) - t0 )) s)"
    pack
}
run bench_programs 240 python3 benchmarks/bench_programs.py --out "$RES"
run bench_memory_bound 90 python3 benchmarks/bench_memory_bound.py --out "$RES"
run bench_attention 90 python3 benchmarks/bench_attention.py --out "$RES"
run bench_conv_zoo 100 python3 benchmarks/bench_conv_zoo.py --out "$RES"
run bench_ctc_sampler 90 python3 benchmarks/bench_ctc_sampler.py --out "$RES"
run fuse_profile 60 python3 benchmarks/fuse_profile.py
run multi_gpu_example 60 env PYTHONPATH=. python3 -m torch.distributed.run --nproc-per-node 1 \
    examples/multi_gpu_data_parallel.py --check
if [ "$FUZZ" != 0 ]; then
    run fuzz_gpu 120 python3 benchmarks/fuzz_nightly.py --place gpu --examples "$FUZZ" --batch 10 --jobs 14 \
        --json "$RES/fuzz_gpu.json"
fi
cp benchmarks/results/host_overhead_*.json "$RES/" 2>/dev/null
for f in bench_programs bench_memory_bound bench_attention bench_ctc_sampler fuse_profile multi_gpu_example fuzz_gpu; do
    [ -f "$RES/$f.log" ] && { echo "== $f"; grep -v -i "warn" "$RES/$f.log" | tail -"${TAIL:-14}"; }
done
pack
echo "total $(( $(date +%s) - started )) s; wrote $OUT/device_check.tgz"
