"""A Tinker-compatible training and sampling server over the trainer's backend.

The unmodified `tinker` SDK drives it: sessions, training clients (LoRA or full), the future /
long-poll protocol with protobuf results, checkpoints under `tinker://` paths that survive a
restart, and sampling through the embedded inference server with exactly the saved weights.

Layout: `store` (checkpoints and sampling sessions on disk), `futures` (request ids, results,
long-poll), `ordering` (per-model seq_id order), `losses` (Tinker's loss_fn_config),
`proto` (the SDK's protobuf messages), `models` (training models), `sampling` (samplers),
`service` (the operations), `app` (HTTP routes), `server` (start-up).
"""
