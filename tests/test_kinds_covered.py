"""Every finding kind of the contract (model/kinds.inc) has a test that
commits the bug for real and asserts the kind and the Python file:line of
the event that matters. This map names those tests; a kind added to
kinds.inc without one, or a test renamed away, fails here."""
import ast
from pathlib import Path

from conftest import contract_kinds

HERE = Path(__file__).resolve().parent

COVERED = {
    "dlpack-double-delete": ["test_dlpack_findings.py::test_double_delete",
                             "test_dlpack_findings.py::test_released_struct_quarantined",
                             "test_dlpack_versioned.py::test_versioned_double_delete"],
    "dlpack-unchecked-destructor": ["test_dlpack_findings.py::test_unchecked_destructor"],
    "dlpack-not-renamed": ["test_dlpack_findings.py::test_not_renamed",
                           "test_dlpack_versioned.py::test_versioned_not_renamed"],
    "dlpack-reconsume": ["test_dlpack_findings.py::test_reconsume",
                         "test_dlpack_versioned.py::test_versioned_reconsume"],
    "dlpack-leak": ["test_dlpack_findings.py::test_leak_consumed_never_deleted",
                    "test_dlpack_findings.py::test_leak_capsule_without_destructor",
                    "test_dlpack_versioned.py::test_versioned_leak"],
    "dlpack-data-freed": ["test_dlpack_data_freed.py::test_image_freed_under_the_consumer"],
    "live-at-exit": ["test_endings.py::test_os_exit_with_live_torch_tensors"],
    "dlpack-null-deleter": ["test_dlpack_findings.py::test_null_deleter_export_is_legal",
                            "test_dlpack_findings.py::test_null_deleter_call_segfaults"],
    "dlpack-bad-tensor": ["test_dlpack_findings.py::test_bad_tensor",
                          "test_dlpack_versioned.py::test_versioned_bad_tensor_shape_written"],
    "dlpack-byte-offset-ignored": ["test_dlpack_findings.py::test_byte_offset_ignored_by_torch",
                                   "test_dlpack_findings.py::test_byte_offset_dropped_by_reexport"],
    "dlpack-deleter-no-gil": ["test_gil.py::test_deleter_uses_python_without_gil"],
    "dlpack-device-mismatch": ["test_dlpack_findings.py::test_device_mismatch"],
    "numpy-leak": ["test_numpy_findings.py::test_leak_keep_forever",
                   "test_numpy_findings.py::test_leak_refcount",
                   "test_numpy_findings.py::test_leak_at_exit"],
    "numpy-double-free": ["test_numpy_findings.py::test_double_free_really_crashes",
                          "test_numpy_findings.py::test_double_free_trace"],
    "numpy-foreign-free": ["test_numpy_findings.py::test_foreign_free_offset16_really_crashes",
                           "test_numpy_findings.py::test_foreign_free_exact_trace"],
    "numpy-stale-handler": ["test_numpy_findings.py::test_stale_handler_swapped_in_place",
                            "test_numpy_findings.py::test_pool_switch_in_place",
                            "test_numpy_findings.py::test_stale_handler_struct_freed",
                            "test_numpy_findings.py::test_stale_handler_ctx_freed"],
    "numpy-bad-handler": ["test_numpy_findings.py::test_bad_handler_whole_run",
                          "test_numpy_findings.py::test_bad_handler_trace"],
    "capsule-no-gil": ["test_gil.py::test_capsule_call_without_gil"],
    "dlpack-exchange-contract": ["test_exchange_api.py::test_xapi_contract_no_gil",
                                 "test_exchange_api.py::test_xapi_contract_producer_rc_without_error",
                                 "test_exchange_api.py::test_xapi_contract_allocator_set_error",
                                 "test_exchange_paths.py::test_ffi_error_lost_around_conversions"],
    "dlpack-bad-exchange-table": ["test_exchange_api.py::test_xapi_bad_table"],
    "dlpack-stale-view": ["test_exchange_api.py::test_xapi_stale_view",
                          "test_exchange_paths.py::test_view_freed_by_another_thread",
                          "test_exchange_paths.py::test_view_kept_past_its_call"],
    "dlpack-error-clobbered": ["test_dlpack_findings.py::test_destructor_clears_pending_error"],
    "dlpack-destructor-reentered": ["test_realworld.py::test_numpy_destructor_reentered",
                                    "test_realworld.py::test_numpy_destructor_reentered_protect"],
    "numpy-handler-no-gil": ["test_gil.py::test_numpy_handler_without_gil"],
    "arrow-leak": ["test_arrow_findings.py::test_leak_moved_never_released",
                   "test_arrow_findings.py::test_leak_capsule_without_destructor",
                   "test_arrow_findings.py::test_child_left_by_parent_release",
                   "test_arrow_findings.py::test_moved_child_never_released",
                   "test_arrow_byaddr.py::test_leak_exported_never_released"],
    "arrow-double-release": ["test_arrow_findings.py::test_double_release_copy_not_move",
                             "test_arrow_findings.py::test_double_release_without_protect_really_crashes",
                             "test_arrow_byaddr.py::test_double_release_copy_not_move"],
    "arrow-release-not-cleared": ["test_arrow_findings.py::test_release_not_cleared",
                                  "test_arrow_byaddr.py::test_release_not_cleared_before_pyarrow_aborts"],
    "arrow-reconsume": ["test_arrow_findings.py::test_reconsume"],
    "arrow-use-after-release": ["test_arrow_findings.py::test_use_after_release",
                                "test_arrow_byaddr.py::test_use_after_release_through_stale_copy"],
    "arrow-stream-misuse": ["test_arrow_findings.py::test_stream_misuse_two_threads",
                            "test_arrow_byaddr.py::test_stream_misuse_prefetch_thread"],
    "arrow-renamed": ["test_arrow_findings.py::test_renamed"],
    "arrow-bad-struct": ["test_arrow_findings.py::test_bad_struct_handed_out_empty",
                         "test_arrow_findings.py::test_bad_struct_device_type",
                         "test_arrow_byaddr.py::test_bad_struct_import_of_empty_stream"],
    "arrow-bad-name": ["test_arrow_findings.py::test_bad_name_near_miss"],
}


def test_every_contract_kind_has_a_test():
    names = {n for n, _ in contract_kinds()}
    assert names, "kinds.inc lists no kind"
    assert names - set(COVERED) == set(), "kinds without a test that commits the bug"
    assert set(COVERED) - names == set(), "kinds no longer in kinds.inc"


def test_the_named_tests_exist():
    defined = {}
    for ref in {r for refs in COVERED.values() for r in refs}:
        file, func = ref.split("::")
        if file not in defined:
            tree = ast.parse((HERE / file).read_text())
            defined[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert func in defined[file], f"{ref} does not exist"
