"""Which default-lane tests run in the slow lane instead, and why: the default suite (`pytest -n 2`)
stays a quick check of every contract, and CI's slow lane (`-m slow`) still runs all of these.

Each entry is a test (every case) or one case (``name[case]``). conftest.py marks them slow at
collection, and ``tests/test_lanes.py`` checks that each still names a test. Measured with
``pytest -n 2 --durations=0`` from a fresh clone (worker-seconds in the comments).
"""

# The same contract at library level stays in the default lane; these go through processes,
# the CLI and files end to end.
END_TO_END = {
    "test_mixers_train.py::test_each_mixer_trains_and_generates_through_the_cli": 33,
    "test_model_variants.py::test_each_variant_trains_through_attnlab_train": 44,
    "test_model_variants.py::test_generate_runs_past_the_window": 8,
    "test_model_bias_norms.py::test_linear_bias_trains_through_the_cli": 16,
    "test_model_encodings.py::test_a_new_encoding_trains_and_generates_with_the_kv_cache": 27,
    "test_model_parts.py::test_a_new_block_kind_trains_and_decodes": 13,
    "test_icl_cli.py::test_attention_draws_a_hybrids_mamba_and_softmax_layers": 35,
    "test_data_shards.py::test_attnlab_train_trains_on_shards_with_a_tokenizer_json": 18,
    "test_sweep_parts.py::test_a_registered_mode_and_rule_plan_and_train_end_to_end": 18,
    "test_data_source_parts.py::test_a_registered_source_is_checked_built_and_trained_end_to_end": 11,
    "test_environment.py::test_a_run_logs_its_environment_first": 16,
    "test_train_loop.py::test_a_document_masked_run_trains_and_continues_a_batch_of_prompts": 11,
    "test_train_ensemble.py::test_an_ensemble_trains_each_member_as_its_own_run": 26,
    "test_sweep_run.py::test_isoflop_sweep_on_two_workers": 22,
    "test_sweep_run.py::test_an_ensembled_sweep_gives_the_table_of_lone_runs": 15,
    "test_model_ngpt.py::test_norms_stay_one_through_real_training_steps": 10,
    "test_icl_cli.py::test_icl_on_an_induction_run_writes_the_repeat_loss_and_head_scores": 21,
    "test_icl_cli.py::test_attention_on_text_draws_the_maps_of_a_text_run": 12,
    # the same refusals in-process stay (test_errors_table.py's other tests)
    "test_errors_table.py::test_as_a_process_one_line_and_exit_2": 25,
}

# Resuming equals the uninterrupted run: the unit tests of batch order and checkpoint restore
# stay in the default lane; these compare two trained runs.
RESUMES = {
    "test_data_icl.py::test_a_task_run_resumed_from_a_checkpoint_ends_where_an_uninterrupted_one_does": 16,
    "test_icl_regression.py::test_a_regression_run_resumed_from_a_checkpoint_ends_where_an_uninterrupted_one_does": 14,
    "test_train_encoders.py::test_resuming_masks_batch_i_as_the_uninterrupted_run": 14,
    "test_data_mixture.py::test_a_resumed_mixture_run_ends_as_an_uninterrupted_one": 12,
    "test_model_scan.py::test_a_scanned_run_trains_checkpoints_and_resumes": 10,
    "test_train_branch.py::test_branch_equals_the_run_from_scratch": 12,
}

# Sharded equals unsharded on 8 CPU devices: each compiles a mesh program; the one-device
# contracts and test_train_parallel's other cases stay.
SHARDED = {
    "test_model_moe_expert_parallel.py::test_dropless_expert_parallel_equals_one_device": 35,
    "test_model_moe_sharded.py::test_sharded_moe_steps_equal_the_single_device_steps": 28,
    "test_train_parallel.py::test_sharded_step_matches_single_device": 19,
    "test_model_scan.py::test_a_scanned_run_on_8_devices_with_fsdp_matches_one_device": 15,
    "test_lowering.py::test_the_gpt2_small_train_step_lowers_for": 22,
}

# Short fuzz runs: the long fuzz lanes run by hand (`-m fuzz`); CI's slow lane keeps these.
FUZZ = {
    "test_fuzz_configs.py::test_config_fuzz_run": 47,
    "test_fuzz_fit.py::test_fit_fuzz": 37,
    "test_fuzz_sweep_specs.py::test_sweep_spec_fuzz": 9,
}

# Per-variant cases: one case of each contract stays in the default lane.
VARIANT_CASES = {
    "test_model_documents.py::test_no_token_sees_another_document[einsum]": 27,
    "test_model_documents.py::test_no_token_sees_another_document[mamba]": 20,
    "test_model_encoders.py::test_the_common_measure_scores_the_same_tokens_for_every_objective": 23,
    "test_model_moe.py::test_scan_and_remat_equal_the_layer_loop": 23,
    "test_train_ensemble.py::test_a_diverging_member_is_frozen_and_the_others_go_on": 10,
    "test_model_scan.py::test_remat_of_the_encoder_decoder_gives_the_gradients_of_none": 12,
    "test_model_decoding.py::test_kv_cache_decoding_equals_full_forward[rope_gqa_qknorm]": 10,
    "test_model_decoding.py::test_kv_cache_decoding_equals_full_forward[alibi_mqa_chunked]": 7,
}

# Real sweeps trained to check a planner's or a lease's bookkeeping, and resampling studies of
# many refits: their library-level contracts (the plan, the picks of one table) stay.
STUDIES = {
    "test_device_runs.py::test_a_fresh_machine_trains_only_what_the_last_lease_left": 36,
    "test_sweep_refine.py::test_a_real_sweep_grows_where_its_best_rate_is_the_largest": 21,
    "test_sweep_refine.py::test_a_real_sweep_grows_a_batch_size_where_the_largest_is_best": 15,
    "test_scaling_repick.py::test_each_group_of_by_redraws_its_own_picks": 27,
    "test_scaling_repick.py::test_picks_the_seeds_cannot_single_out_widen_the_intervals": 44,
}

SLOW_LANE: dict[str, int] = {**END_TO_END, **RESUMES, **SHARDED, **FUZZ, **VARIANT_CASES,
                             **STUDIES}


def moved(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``tests/file.py::name[case]``) is one SLOW_LANE names."""
    short = nodeid.split("/", 1)[-1]
    return short in SLOW_LANE or short.split("[", 1)[0] in SLOW_LANE
