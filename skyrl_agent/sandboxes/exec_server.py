"""The process that lives inside a local (bubblewrap) sandbox and runs commands on request.

Runs with the system python3 of the sandbox (stdlib only, any Python >= 3.8): it must not import
skyrl_agent. Every command of a sandbox runs through this one process, so all share one PID
namespace (background processes such as a tmux server survive between commands, as in a
container). It exits at its deadline (SIGALRM) or when stdin closes; bubblewrap then tears the
namespace down and every process in it dies.

Host -> server: a 4-byte big-endian length, then a `marshal`-encoded dict
  {"id", "cmd", "cwd", "env", "timeout", "stdin", "max_output"}  (marshal is built in: fast start).
Server -> host: first the line `ready <pid>`, then per reply the line
  `<id> <exit_code> <timed_out 0|1> <duration_s> <stdout bytes> <stderr bytes>` followed by the
  raw stdout and stderr. Plain text and lengths only: anything in the sandbox could write to this
  pipe, so the host must never unmarshal what comes back.
"""

import marshal
import os
import signal
import subprocess
import sys
import threading
import time

_write_lock = threading.Lock()


def reply(request_id, exit_code, timed_out, duration_s, stdout=b"", stderr=b""):
    header = b"%d %d %d %.6f %d %d\n" % (request_id, exit_code, 1 if timed_out else 0,
                                         duration_s, len(stdout), len(stderr))
    with _write_lock:
        sys.stdout.buffer.write(header + stdout + stderr)
        sys.stdout.buffer.flush()


def read_request(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    return marshal.loads(stream.read(int.from_bytes(header, "big")))


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
    stdin_data = request.get("stdin")
    try:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", request["cmd"]], cwd=request.get("cwd") or None, env=env,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        reply(request["id"], 127, False, time.monotonic() - started, stderr=str(exc).encode())
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
    reply(request["id"], -1 if timed_out else exit_code, timed_out, time.monotonic() - started,
          readers[0].value(), readers[1].value())


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
    sys.stdout.buffer.write(b"ready %d\n" % os.getpid())
    sys.stdout.buffer.flush()
    while True:
        request = read_request(sys.stdin.buffer)
        if request is None:
            return
        try:
            threading.Thread(target=run, args=(request, base_env), daemon=True).start()
        except RuntimeError as exc:  # no thread: the sandbox is out of processes
            reply(request["id"], 126, False, 0.0, stderr=str(exc).encode())


if __name__ == "__main__":
    main()
