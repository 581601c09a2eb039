"""Writes docs/reference/tinker-compat.md: every public method of the installed tinker SDK's
clients (ServiceClient, TrainingClient, SamplingClient, RestClient; a method and its `_async`
twin are one row) and what `skyrl-agent tinker-serve` does with it, each row with the test that
shows it through the SDK.

    .venv/bin/python scripts/tinker_compat.py          # (re)write the page
    .venv/bin/python scripts/tinker_compat.py --check  # exit 1 if the page is stale, or the SDK
                                                       # has a method this table does not place

The table below is the one place that says how each method is served; a new SDK release that
adds a method fails `--check` until someone decides.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "tinker-compat.md"
CLIENTS = ("ServiceClient", "TrainingClient", "SamplingClient", "RestClient")

SDK_FLOW = ("tests/test_tinker.py::test_sdk_trains_every_loss_saves_loads_and_samples_the_"
            "trained_weights")
REST = "tests/test_tinker_rest.py::test_checkpoints_through_the_rest_client"
STATES = "tests/test_tinker_rest.py::test_sessions_states_and_samplers_through_the_sdk"
REFUSED = ("tests/test_tinker_rest.py::test_what_a_self_hosted_server_cannot_honour_is_"
           "refused_by_name")
LOSSES = "tests/test_tinker_losses.py::test_each_loss_with_tinkers_defaults_is_its_formula"


@dataclass(frozen=True)
class Row:
    status: str
    """served, refused (the SDK's own error, a message naming the method) or client-side (the
    SDK answers it without the server)."""
    test: str | None
    note: str = ""


def served(test: str, note: str = "") -> Row:
    return Row("served", test, note)


def refused(test: str, note: str) -> Row:
    return Row("refused", test, note)


def client_side(note: str, test: str | None = None) -> Row:
    return Row("client-side", test, note)


TABLE: dict[str, Row] = {
    "ServiceClient.close": served(
        "tests/test_tinker.py::test_closing_a_service_client_releases_its_models",
        "releases the session's training models"),
    "ServiceClient.copy_weights": refused(REFUSED, "BadRequestError: no other deployment to "
                                                   "copy to (RestClient's form is tested)"),
    "ServiceClient.create_custom_loss": client_side(
        "no server-side custom losses offered: the SDK runs the loss in the client",
        "tests/test_tinker_rest.py::test_a_custom_loss_handle_runs_client_side"),
    "ServiceClient.create_lora_training_client": served(SDK_FLOW),
    "ServiceClient.create_rest_client": served(REST),
    "ServiceClient.create_sampling_client": served(
        "tests/test_tinker.py::test_models_on_one_server_are_isolated_and_base_sampling_sees_"
        "base_weights", "from saved weights or a base model"),
    "ServiceClient.create_training_client_from_state": served(STATES),
    "ServiceClient.create_training_client_from_state_with_optimizer": served(
        "tests/test_tinker_restart.py::test_checkpoints_and_sampling_sessions_survive_a_kill_"
        "and_the_sdk_rides_the_outage"),
    "ServiceClient.get_console_url": client_side("a link into Tinker's hosted console"),
    "ServiceClient.get_server_capabilities": served(STATES),
    "ServiceClient.get_telemetry": client_side("the SDK's own telemetry object"),
    "ServiceClient.holder": client_side("the SDK's connection holder"),
    "TrainingClient.create_sampling_client": served(STATES),
    "TrainingClient.forward": served(LOSSES, "reports the loss too, without a gradient"),
    "TrainingClient.forward_backward": served(
        LOSSES, "cross_entropy, importance_sampling, ppo, cispo, dro (Tinker's defaults), gspo"),
    "TrainingClient.forward_backward_custom": served(
        "tests/test_tinker.py::test_custom_loss_runs_through_forward_and_real_valued_weights"),
    "TrainingClient.get_console_url": client_side("a link into Tinker's hosted console"),
    "TrainingClient.get_info": served(SDK_FLOW),
    "TrainingClient.get_telemetry": client_side("the SDK's own telemetry object"),
    "TrainingClient.get_tokenizer": served(SDK_FLOW, "the base model's local folder"),
    "TrainingClient.load_state": served(SDK_FLOW),
    "TrainingClient.load_state_with_optimizer": served(SDK_FLOW),
    "TrainingClient.optim_step": served(SDK_FLOW, "Adam only (others: BadRequestError)"),
    "TrainingClient.save_state": served(REST, "ttl_seconds honoured"),
    "TrainingClient.save_weights_and_get_sampling_client": served(SDK_FLOW),
    "TrainingClient.save_weights_external": refused(
        "tests/test_tinker_rest.py::test_an_external_weights_export_is_refused_by_name",
        "BadRequestError: no external store"),
    "TrainingClient.save_weights_for_sampler": served(SDK_FLOW),
    "SamplingClient.compute_logprobs": served(STATES),
    "SamplingClient.create": client_side("what create_sampling_client calls"),
    "SamplingClient.from_sampler_handle": served(STATES),
    "SamplingClient.get_base_model": served(STATES),
    "SamplingClient.get_sampler_handle": served(STATES),
    "SamplingClient.get_telemetry": client_side("the SDK's own telemetry object"),
    "SamplingClient.get_tokenizer": client_side(
        "loads the tokenizer named like the base model from the Hugging Face cache (serve a "
        "model under its hub name for this to work offline)"),
    "SamplingClient.on_queue_state_change": client_side("a callback the SDK calls"),
    "SamplingClient.sample": served(SDK_FLOW, "prompt logprobs and top-k prompt logprobs; "
                                              "top-k sample logprobs refused"),
    "RestClient.assign_session_project": refused(REFUSED, "BadRequestError: no projects"),
    "RestClient.copy_weights": refused(REFUSED, "BadRequestError: no other deployment"),
    "RestClient.delete_checkpoint": served(REST, "as delete_checkpoint_from_tinker_path"),
    "RestClient.delete_checkpoint_from_tinker_path": served(REST),
    "RestClient.export_session_trace": refused(REFUSED, "BadRequestError: no traces kept"),
    "RestClient.get_audit_log": refused(REFUSED, "BadRequestError: no audit log"),
    "RestClient.get_billing_usage": refused(REFUSED, "BadRequestError: no billing"),
    "RestClient.get_current_checkpoint_storage_usage": refused(REFUSED,
                                                               "BadRequestError: no billing"),
    "RestClient.get_external_weights_urls": refused(REFUSED, "BadRequestError: no external "
                                                             "store"),
    "RestClient.get_sampler": served(STATES),
    "RestClient.get_server_capabilities": served(STATES),
    "RestClient.get_session": served(STATES),
    "RestClient.get_telemetry": client_side("the SDK's own telemetry object"),
    "RestClient.get_training_run": served(
        "tests/test_tinker_rest.py::test_two_tenants_train_side_by_side_and_stay_apart"),
    "RestClient.get_training_run_by_tinker_path": served(REST),
    "RestClient.get_weights_info_by_tinker_path": served(REST),
    "RestClient.list_checkpoints": served(REST),
    "RestClient.list_sessions": served(STATES),
    "RestClient.list_training_runs": served(REST, "owned, or accessible (published)"),
    "RestClient.list_user_checkpoints": served(REST),
    "RestClient.publish_checkpoint_from_tinker_path": served(REST),
    "RestClient.search_sessions": refused(REFUSED, "BadRequestError: use list_sessions"),
    "RestClient.set_checkpoint_ttl_from_tinker_path": served(REST, "expired checkpoints go"),
    "RestClient.unpublish_checkpoint_from_tinker_path": served(REST),
    "RestClient.whoami": client_side("the SDK raises at once without JWT authentication"),
}


def sdk_methods() -> dict[str, list[str]]:
    """Per client class: its public methods and properties, an `_async` twin folded into its
    method (listed as the forms it has)."""
    import tinker

    found: dict[str, list[str]] = {}
    for name in CLIENTS:
        cls = getattr(tinker, name)
        public = {n for n, v in inspect.getmembers(cls) if not n.startswith("_")
                  and (callable(v) or isinstance(inspect.getattr_static(cls, n), property))}
        found[name] = sorted(n for n in public
                             if not (n.endswith("_async") and n[:-6] in public))
    return found


def render() -> str:
    import tinker

    methods = sdk_methods()
    rows = {f"{cls}.{m}": TABLE.get(f"{cls}.{m}") for cls, names in methods.items()
            for m in names}
    counts = {s: sum(r is not None and r.status == s for r in rows.values())
              for s in ("served", "refused", "client-side")}
    lines = ["# Tinker SDK compatibility", "",
             f"Generated by `scripts/tinker_compat.py` from the installed `tinker` "
             f"{tinker.__version__}: {len(rows)} public methods of its four clients (a method "
             "and its `_async` form are one row).", "",
             f"- **{counts['served']}** served by `skyrl-agent tinker-serve`, each with the "
             "test that drives it through the SDK;",
             f"- **{counts['refused']}** refused with the SDK's own error type and a message "
             "naming the method (they need Tinker's hosted services);",
             f"- **{counts['client-side']}** answered by the SDK itself, without the server.",
             ""]
    for cls, names in methods.items():
        lines += [f"## `{cls}`", "", "| method | status | notes | test |", "|---|---|---|---|"]
        for name in names:
            row = rows[f"{cls}.{name}"]
            assert row is not None
            twin = f" / `{name}_async`" if hasattr(getattr(tinker, cls), f"{name}_async") else ""
            test = f"`{row.test.split('::')[1]}` ({row.test.split('::')[0]})" if row.test else ""
            lines.append(f"| `{name}`{twin} | {row.status} | {row.note} | {test} |")
        lines.append("")
    return "\n".join(lines)


def unplaced() -> tuple[list[str], list[str]]:
    """SDK methods the table does not place, and table rows the SDK does not have."""
    methods = {f"{cls}.{m}" for cls, names in sdk_methods().items() for m in names}
    return sorted(methods - TABLE.keys()), sorted(TABLE.keys() - methods)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    missing, gone = unplaced()
    if missing or gone:
        print(f"error: the SDK's methods and the table disagree: not placed {missing}; "
              f"not in the SDK {gone}", file=sys.stderr)
        return 1
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"error: {PAGE.relative_to(ROOT)} out of date: run scripts/tinker_compat.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
