#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, then the kernel benchmark, logs into OUTDIR.
#   benchmarks/run_gpu_suite.sh OUTDIR
# BENCH_ARGS adds options to bench_kernels.py (e.g. "--pairs f16/f16 --ctx 4096,65536").
# Wheels of packages the machine lacks (msgspec, platformdirs, pyelftools) may sit in .whl/.
set -u -o pipefail
out=${1:-out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KVDIAG_GPU_REPORT=$out/gpu_report.txt
: > "$out/gpu_report.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
    --format=csv > "$out/nvidia_smi.txt" 2>&1
{ python3 -m kvdiag devices; echo "exit $?"; } > "$out/devices.txt" 2>&1
echo "== pytest -m gpu tests/test_gpu_executor.py tests/test_gpu_scenarios.py tests/test_gpu_profile.py" | tee "$out/gpu_tests.txt"
timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -m gpu tests/test_gpu_executor.py \
    tests/test_gpu_scenarios.py tests/test_gpu_profile.py -q -rs -p no:cacheprovider --durations=8 2>&1 | tee -a "$out/gpu_tests.txt"
if [ -z "${SKIP_KERNEL_BENCH:-}" ]; then
    echo "== benchmarks/bench_kernels.py" | tee "$out/bench_kernels.txt"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    timeout "${BENCH_TIMEOUT:-230}" python3 benchmarks/bench_kernels.py ${BENCH_ARGS:-} \
        --json "$out/bench_kernels.json" 2>&1 | tee -a "$out/bench_kernels.txt"
fi
if [ -n "${NATIVE:-}" ]; then
    # kernels/kvtrace.h from a .cu program on the GPU, its trace read back by kvdiag; the
    # header's cost on this machine's CPUs; the device profile; a sweep on the CuPy executor
    n="$out/native.txt"
    echo "== kvtrace_cuda_demo (nvcc $(nvcc --version | tail -1))" | tee "$n"
    nvcc -std=c++17 -O2 -I kernels -o /tmp/kvtrace_cuda_demo \
        kernels/native_tests/kvtrace_cuda_demo.cu >> "$n" 2>&1
    (cd /tmp && KVTRACE_FILE=/tmp/cuda_demo_%p.kvtrace ./kvtrace_cuda_demo; echo "exit $?") >> "$n" 2>&1
    t=$(ls /tmp/cuda_demo_*.kvtrace 2>/dev/null | head -1)
    if [ -n "$t" ]; then
        cp "$t" "$out/cuda_demo.kvtrace"
        for c in "trace validate" "trace info" "check"; do
            echo "== kvdiag $c" >> "$n"
            # shellcheck disable=SC2086
            python3 -m kvdiag $c "$t" >> "$n" 2>&1; echo "exit $?" >> "$n"
        done
    fi
    echo "== kvdiag devices --profile" >> "$n"
    python3 -m kvdiag devices --profile --save "$out/device_profile.json" >> "$n" 2>&1
    echo "== sweep (cupy executor)" >> "$n"
    timeout "${SWEEP_TIMEOUT:-200}" python3 -m kvdiag sweep --executor cupy ${SWEEP_ARGS:---stage-mib 4:16:2} \
        --profile "$out/device_profile.json" -q >> "$n" 2>&1
    echo "== benchmarks/bench_native.py" | tee "$out/bench_native.txt"
    timeout "${NATIVE_BENCH_TIMEOUT:-200}" python3 benchmarks/bench_native.py 2>&1 | tee -a "$out/bench_native.txt"
fi
if [ -n "${PROBE:-}" ]; then
    echo "== benchmarks/probe_layouts.py" | tee "$out/probe_layouts.txt"
    timeout "${PROBE_TIMEOUT:-200}" python3 benchmarks/probe_layouts.py 2>&1 | tee -a "$out/probe_layouts.txt"
fi
if [ -n "${NCU:-}" ]; then
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    echo "== $ncu_bin on benchmarks/profile_attention.py" | tee "$out/ncu.txt"
    timeout "${NCU_TIMEOUT:-150}" "$ncu_bin" --clock-control none --kernel-name regex:kv_fattn_partial \
        --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
        --section InstructionStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/profile_attention.py >> "$out/ncu.txt" 2>&1
    tail -5 "$out/ncu.txt"
fi
