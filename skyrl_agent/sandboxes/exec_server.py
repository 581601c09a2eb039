"""The process that lives inside a local (bubblewrap) sandbox and runs commands on request.

Runs with the system python3 of the sandbox (stdlib only, any Python >= 3.8): it must not import
skyrl_agent. It reads one JSON request per line on stdin and writes one JSON reply per line on
stdout, so every command of a sandbox shares one PID namespace (background processes such as a
tmux server survive between commands, as in a container). It exits at its deadline (SIGALRM) or
when stdin closes; bubblewrap then tears the namespace down and every process in it dies.

Request: {"id", "cmd", "cwd", "env", "timeout", "stdin_b64", "max_output"}
Reply:   {"id", "exit_code", "stdout_b64", "stderr_b64", "timed_out", "duration_s"}
"""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

_write_lock = threading.Lock()


def reply(message):
    line = json.dumps(message) + "\n"
    with _write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class CappedReader(threading.Thread):
    """Drains a pipe, keeping the first and last `limit // 2` bytes so a flood cannot fill memory."""

    def __init__(self, pipe, limit):
        super().__init__(daemon=True)
        self.pipe, self.half = pipe, max(1, limit // 2)
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0

    def run(self):
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            room = self.half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]

    def value(self):
        if not self.dropped:
            return bytes(self.head + self.tail)
        marker = ("\n[... %d bytes cut ...]\n" % self.dropped).encode()
        return bytes(self.head) + marker + bytes(self.tail)


def run(request, base_env):
    started = time.monotonic()
    env = dict(base_env)
    env.update(request.get("env") or {})
    limit = int(request.get("max_output") or 1000000)
    stdin_data = base64.b64decode(request["stdin_b64"]) if request.get("stdin_b64") else None
    try:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", request["cmd"]], cwd=request.get("cwd") or None, env=env,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        reply({"id": request["id"], "exit_code": 127, "stdout_b64": "",
               "stderr_b64": base64.b64encode(str(exc).encode()).decode(),
               "timed_out": False, "duration_s": time.monotonic() - started})
        return
    readers = [CappedReader(proc.stdout, limit), CappedReader(proc.stderr, limit)]
    for reader in readers:
        reader.start()
    if stdin_data is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin_data), daemon=True).start()
    timeout = request.get("timeout")
    deadline = None if timeout is None else started + timeout
    timed_out = False
    try:
        exit_code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        exit_code = -1
    # Background children may hold the pipes open after the shell exits: wait for them only
    # until the timeout, then kill the whole group (a fork bomb ends here too).
    for reader in readers:
        reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if any(reader.is_alive() for reader in readers):
        timed_out = True
    if timed_out:
        _kill_group(proc.pid)
        proc.wait()
        for reader in readers:
            reader.join(2)  # a process that left the group may still hold a pipe
    reply({"id": request["id"], "exit_code": -1 if timed_out else exit_code,
           "stdout_b64": base64.b64encode(readers[0].value()).decode(),
           "stderr_b64": base64.b64encode(readers[1].value()).decode(),
           "timed_out": timed_out, "duration_s": time.monotonic() - started})


def _feed(pipe, data):
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass


def _kill_group(pgid):
    # Repeat: a member forking while the signal is delivered can add a new process.
    for _ in range(200):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            return
        time.sleep(0.005)


def main():
    deadline_s = float(sys.argv[1])
    signal.alarm(max(1, int(deadline_s + 0.999)))  # default SIGALRM action ends this process
    base_env = dict(os.environ)
    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            try:
                threading.Thread(target=run, args=(request, base_env), daemon=True).start()
            except RuntimeError as exc:  # no thread: the sandbox is out of processes
                reply({"id": request["id"], "exit_code": 126, "stdout_b64": "",
                       "stderr_b64": base64.b64encode(str(exc).encode()).decode(),
                       "timed_out": False, "duration_s": 0.0})


if __name__ == "__main__":
    main()
