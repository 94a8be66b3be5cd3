"""Every log/backtrace form in tests/fixtures/logs parses to the records it holds."""

from __future__ import annotations

from postmortem_helpers import FIXTURES, findings_of, scan_bytes, scan_fixture


def test_kvstream_np2_gdb_boot_crash_and_timeline() -> None:
    scan = scan_fixture("kvstream_np2_gdb.log")
    (boot,) = scan.boots
    assert (boot.n_seq_max, boot.n_stream, boot.n_ctx, boot.n_ctx_seq) == (2, 2, 16384, 8192)
    assert (boot.n_batch, boot.n_ubatch, boot.flash_attn, boot.kv_unified) == (
        2048, 512, "enabled", False)
    assert (boot.type_k, boot.type_v) == ("q8_0", "q8_0")
    assert boot.kv_buffers == {"CUDA_KV_Stream_Host": 1024.0}
    assert boot.kv_stream and boot.kv_stream_pool_mib == 1536.0
    assert (boot.kv_stream_device, boot.kv_stream_layers) == ("CUDA0", 16)
    assert boot.multiseq_optin
    assert boot.model == "/models/qwen3.5-27b-q4_k_m.gguf"
    (crash,) = scan.crashes
    assert crash.kind == "assert" and crash.where.line == 38
    assert crash.abort is not None
    assert crash.abort.condition == "ggml_cuda_kv_stream_fattn_fits(dst)"
    assert crash.abort.line == 1898 and crash.abort.file is not None
    assert crash.abort.file.endswith("ggml-cuda/ggml-cuda.cu")
    assert crash.active_slots == (0, 1)
    assert [(e.where.line, e.kind, e.slot) for e in crash.timeline if e.kind == "launch"] == [
        (26, "launch", 1), (33, "launch", 0)]
    assert crash.fits and crash.fits[-1].ne == (256, 24, 1, 2)
    assert crash.fits[-1].kbuf == "CUDA_KV_Stream_Host"
    bt = crash.backtrace
    assert bt is not None and bt.form == "gdb" and len(bt.frames) == 14
    # gdb prints no address for the frame an inlined function sits in: #3 (with an address)
    # is the inlined ggml_cuda_kv_stream_fattn, #4 the ggml_cuda_compute_forward it is in
    f3, f4 = bt.frames[3], bt.frames[4]
    assert (f3.function, f3.inlined, f3.address) == (
        "ggml_cuda_kv_stream_fattn", True, 0x7F32084B9D11)
    assert (f4.function, f4.inlined, f4.address, f4.line) == (
        "ggml_cuda_compute_forward", False, None, 3053)
    # a frame whose argument list wrapped onto the next line keeps its location
    f5 = bt.frames[5]
    assert (f5.function, f5.line, f5.address) == (
        "ggml_cuda_graph_evaluate_and_capture", 3710, 0x7F32084C0A42)
    assert [f.in_app for f in bt.frames[:4]] == [False, False, False, True]
    assert bt.frames[8].function == "llama_context::graph_compute(ggml_cgraph*, bool)"
    assert bt.frames[8].module == "/home/ci/src/llama.cpp/build/bin/libllama.so"
    (first,) = scan.first_requests
    assert (first.slot, first.task, first.where.line) == (1, 0, 26)
    (adapt,) = scan.stream_events
    assert adapt.kind == "repartition"
    assert adapt.values["resident_to"] == 10 and adapt.values["miss_pct"] == 31.5


def test_kvstream_np2_findings_cite_geometry_and_config() -> None:
    findings = {f.rule: f for f in findings_of(scan_fixture("kvstream_np2_gdb.log"))}
    fits = findings["kvstream-fits-dispatch-abort"]
    assert fits.severity.label == "critical"
    assert fits.details["class"] == "geometry"
    assert fits.details["fits_ne"] == [256, 24, 1, 2]
    assert fits.details["active_slots"] == [0, 1]
    lines = {e.line for e in fits.evidence}
    assert {38, 19, 20, 26, 33, 37} <= lines
    alias = findings["kvstream-multislot-aliasing-risk"]
    assert alias.details == {"slot": 1, "n_stream": 2, "optin": True}
    assert 26 in {e.line for e in alias.evidence}
    assert "ggml-assert" not in findings


def test_cuda_oom_journald_glibc() -> None:
    scan = scan_fixture("cuda_oom_journald_glibc.log")
    (crash,) = scan.crashes
    assert crash.kind == "cuda_error"
    err = crash.error
    assert err is not None
    assert (err.message, err.device, err.function) == (
        "out of memory", 0, "ggml_cuda_pool_vmm::alloc")
    assert err.location == "/opt/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:529"
    assert err.statement == "cuMemCreate(&handle, reserve_size, &prop, 0)"
    assert crash.abort is not None and crash.abort.line == 104
    bt = crash.backtrace
    assert bt is not None and bt.form == "glibc" and len(bt.frames) == 14
    assert bt.frames[0].offset == 0x1B2C8 and bt.frames[0].function is None
    assert bt.frames[4].function == "ggml_cuda_pool_vmm::alloc(unsigned long, unsigned long*)"
    assert bt.symrefs[4] == ("_ZN18ggml_cuda_pool_vmm5allocEmPm", 0x2F4)
    assert not bt.frames[11].in_app and not bt.frames[12].in_app  # libc
    rules = [f.rule for f in findings_of(scan)]
    assert rules == ["cuda-oom"]


def test_cuda_error_reordered_under_router_prefix() -> None:
    scan = scan_fixture("cuda_error_router_reordered.log")
    (boot,) = scan.boots
    assert (boot.n_seq_max, boot.n_stream, boot.kv_unified) == (4, 1, True)
    (crash,) = scan.crashes
    err = crash.error
    assert err is not None
    assert err.message.startswith("an unsupported value or parameter")
    assert (err.device, err.function, err.failed_op) == (1, "ggml_cuda_op_mul_mat_cublas",
                                                         "MUL_MAT")
    assert err.statement is not None and err.statement.startswith("cublasGemmEx(")
    bt = crash.backtrace
    assert bt is not None and len(bt.frames) == 8
    assert "ptrace: Operation not permitted." in bt.notes
    assert bt.frames[4].function is not None
    assert bt.frames[4].function.startswith("ggml_cuda_op_mul_mat_cublas(ggml_backend_cuda")
    (finding,) = findings_of(scan)
    assert finding.rule == "cuda-error" and "MUL_MAT failed" in finding.title


def test_legacy_assert_compose_crlf_ansi_keeps_native_part_of_go_trace() -> None:
    scan = scan_fixture("legacy_compose_crlf_go.log")
    (boot,) = scan.boots
    assert (boot.n_ctx, boot.flash_attn, boot.kv_buffers) == (4096, "disabled", {"CUDA0": 512})
    (crash,) = scan.crashes
    assert crash.abort is not None and crash.abort.form == "legacy"
    assert crash.abort.condition == "ggml_nelements(a) == ne0*ne1"
    assert crash.abort.line == 5021
    bt = crash.backtrace
    assert bt is not None
    names = [f.function for f in bt.frames]
    assert names[2] == "llm_build_context::build_llama_vision()"
    assert len(names) == 6  # Go runtime frames after "SIGABRT: abort" are not kept
    assert not bt.frames[4].in_app  # _cgo_ trampoline
    assert crash.active_slots == (0,)


def test_msvc_windows_assert() -> None:
    (crash,) = scan_fixture("msvc_windows.log").crashes
    ab = crash.abort
    assert ab is not None and ab.form == "msvc"
    assert ab.file == r"D:\a\llama.cpp\llama.cpp\ggml\src\ggml.c" and ab.line == 1554
    assert ab.condition is not None and ab.condition.startswith("view_src == NULL")
    assert crash.backtrace is None


def test_segfault_lldb() -> None:
    scan = scan_fixture("segfault_lldb.log")
    (crash,) = scan.crashes
    assert crash.kind == "segfault" and crash.abort is None
    assert crash.signal is not None and crash.signal.signal == "SIGSEGV"
    bt = crash.backtrace
    assert bt is not None and bt.form == "lldb"
    f0 = bt.frames[0]
    assert (f0.function, f0.module, f0.file, f0.line) == (
        "ggml_compute_forward_get_rows_f32", "libggml-cpu.so", "ops.cpp", 4610)
    assert [f.in_app for f in bt.frames] == [True, True, True, False, False, False]
    (finding,) = findings_of(scan)
    assert finding.rule == "segfault" and "ggml_compute_forward_get_rows_f32" in finding.title


def test_macos_native_backtrace() -> None:
    (crash,) = scan_fixture("macos_native.log").crashes
    bt = crash.backtrace
    assert bt is not None and bt.form == "macos" and len(bt.frames) == 6
    assert bt.frames[2].function == (
        "llama_kv_cache::set_input_kq_mask(ggml_tensor*, llama_ubatch const*, bool) const")
    assert bt.frames[2].module == "libllama.0.0.8099.dylib"
    assert bt.frames[2].address == 0x1028F4E10
    assert [f.in_app for f in bt.frames] == [False, False, True, True, True, False]


def test_glued_threads_truncated_non_utf8() -> None:
    scan = scan_fixture("glued_threads_truncated.log")
    (crash,) = scan.crashes  # two threads, same assert: one process death
    ab = crash.abort
    assert ab is not None and ab.file == "/build/llama.cpp/src/llama-graph.cpp"
    assert ab.condition == "kq_mask->ne[1] >= n_tokens" and ab.where.line == 7
    bt = crash.backtrace
    assert bt is not None and len(bt.frames) == 8
    assert bt.frames[3].function is not None
    assert bt.frames[3].function.startswith("llm_graph_context::build_attn_mha(")
    assert bt.frames[4].function is None
    assert bt.frames[5].function == "llama_context::decode(llama_batch const&) [clone .cold]"
    assert bt.frames[7].address == 0x561F229C0B1 and bt.frames[7].function is None
    messages = {(p.line, p.message) for p in scan.problems}
    assert (7, "2 bytes replaced in 1 line (2 not UTF-8 replaced by U+FFFD); first at line "
               "7") in messages
    assert (17, "last line has no line end (truncated log?)") in messages
    assert crash.active_slots == (0, 1)


def test_coredump_segv_iso_prefix() -> None:
    scan = scan_fixture("coredump_segv.log")
    (crash,) = scan.crashes
    assert crash.kind == "segfault" and crash.signal is not None
    bt = crash.backtrace
    assert bt is not None and bt.form == "coredump"
    assert bt.thread == "Stack trace of thread 3040:"
    assert (bt.frames[0].function, bt.frames[0].module, bt.frames[0].offset) == (
        "ggml_vec_dot_q4_K_q8_K", "libggml-cpu.so", 0x4A1F4)
    assert [f.in_app for f in bt.frames] == [True, True, True, True, False, False]


def test_aliasing_risk_without_crash() -> None:
    scan = scan_fixture("aliasing_no_crash.log")
    assert scan.crashes == ()
    (boot,) = scan.boots
    assert (boot.type_k, boot.type_v, boot.kv_stream_pool_mib) == ("q8_0", "q4_0", 512.0)
    (finding,) = findings_of(scan)
    assert finding.rule == "kvstream-multislot-aliasing-risk"
    assert {e.line for e in finding.evidence} >= {1, 9, 10, 14}
    (trace,) = scan.stream_events
    assert trace.kind == "trace" and trace.values["misses"] == 3


def test_config_rejected() -> None:
    scan = scan_fixture("config_rejected.log")
    (finding,) = findings_of(scan)
    assert finding.rule == "kvstream-config-rejected"
    assert "exactly one sequence" in finding.title and "-np 1" in finding.fix
    assert finding.evidence[0].line == 3


def test_fingerprint_groups_identical_crashes_across_logs() -> None:
    scan = scan_fixture("kvstream_np2_gdb.log", "cuda_oom_journald_glibc.log",
                        "kvstream_np2_gdb.log")
    prints = [c.fingerprint for c in scan.crashes]
    assert prints[0] == prints[2] != prints[1]
    fits = [f for f in findings_of(scan) if f.rule == "kvstream-fits-dispatch-abort"]
    assert len(fits) == 1 and fits[0].details["crashes"] == 2


def test_uncaught_exception() -> None:
    scan = scan_fixture("exception_terminate.log")
    (crash,) = scan.crashes
    assert crash.kind == "exception" and crash.error is not None
    assert crash.error.message == ("std::runtime_error: Unexpected empty grammar stack after "
                                   "accepting piece: <|im_end|>")
    bt = crash.backtrace
    assert bt is not None and len(bt.frames) == 9
    assert [f.in_app for f in bt.frames] == [False, False, False, False, False, False, True,
                                             True, True]
    (finding,) = findings_of(scan)
    assert finding.rule == "uncaught-exception"
    assert "llama_grammar_accept_token" in finding.title


def test_aliasing_risk_is_lower_without_the_opt_in_line() -> None:
    data = (FIXTURES / "aliasing_no_crash.log").read_bytes().split(b"\n", 1)[1]
    (finding,) = findings_of(scan_bytes(data))
    assert finding.rule == "kvstream-multislot-aliasing-risk"
    assert finding.severity.label == "warning" and finding.details["optin"] is False
    (with_optin,) = findings_of(scan_fixture("aliasing_no_crash.log"))
    assert with_optin.severity.label == "error"


def test_no_aliasing_finding_for_unified_kv_or_slot_zero() -> None:
    data = (FIXTURES / "aliasing_no_crash.log").read_bytes()
    unified = data.replace(b"kv_unified    = false", b"kv_unified    = true").replace(
        b"2/2 seqs", b"2/1 seqs")
    assert findings_of(scan_bytes(unified)) == []
    slot0 = data.replace(b"id  1 |", b"id  0 |")
    assert findings_of(scan_bytes(slot0)) == []


def test_sycl_error_with_native_api_message() -> None:
    scan = scan_fixture("sycl_windows_router.log")
    (crash,) = scan.crashes
    err = crash.error
    assert crash.kind == "cuda_error" and err is not None
    assert (err.backend, err.message) == ("SYCL", "-5 (PI_ERROR_OUT_OF_RESOURCES)")
    assert err.statement == "CHECK_TRY_ERROR(stream->memcpy(dst_ptr, src_ptr, size).wait())"
    assert err.function == "ggml_sycl_cpy_tensor_2d"
    assert err.location == r"C:\b\llama.cpp\ggml\src\ggml-sycl\ggml-sycl.cpp:2411"
    assert crash.abort is not None and crash.abort.line == 118
    (finding,) = findings_of(scan)
    assert finding.rule == "cuda-error" and "ggml_sycl_cpy_tensor_2d" in finding.title
