"""The process that lives inside a local (bubblewrap) sandbox and runs commands on request.

Runs with the system python3 of the sandbox (stdlib only, any Python >= 3.9): it must not import
skyrl_agent. Every command of a sandbox runs through this one process, so all share one PID
namespace (background processes such as a tmux server survive between commands, as in a
container). It exits at its deadline or when stdin closes; bubblewrap then tears the namespace
down and every process in it dies.

Agent commands run as the same user, so the server defends its channel to the host:
- it is PID 1 of the sandbox's PID namespace (bubblewrap --as-pid-1), and the kernel drops any
  signal sent to a namespace's init from inside unless init handles it; it handles none;
- it is not dumpable, so without CAP_SYS_PTRACE (dropped) no process can ptrace it, read its
  memory or take its pipes (pidfd_getfd, /proc/1/fd);
- as PID 1 it reaps every orphan, so exit statuses come from its own reaper thread.
A `killall` request kills every other process in the namespace (the agent's, before
verification) and answers once none is left.

Host -> server: a 4-byte big-endian length, then a `marshal`-encoded dict
  {"id", "cmd", "cwd", "env", "timeout", "stdin", "max_output"} or {"id", "op": "killall"}
  (marshal is built in: fast start).
Server -> host: first the line `ready <pid>`, then per reply the line
  `<id> <exit_code> <timed_out 0|1> <duration_s> <stdout bytes> <stderr bytes>` followed by the
  raw stdout and stderr. Plain text and lengths only: anything in the sandbox could write to this
  pipe, so the host must never unmarshal what comes back.
"""

import contextlib
import ctypes
import marshal
import os
import signal
import subprocess
import sys
import threading
import time

_write_lock = threading.Lock()
PR_SET_DUMPABLE = 4
REAPED_ELSEWHERE = -255


class Reaper(threading.Thread):
    """Reaps every child (as PID 1 the orphans are ours too) and keeps the statuses of the
    commands we started, since Popen.wait would race with reaping orphans."""

    def __init__(self):
        super().__init__(daemon=True)
        self.cond = threading.Condition()
        self.statuses = {}
        self.watched = set()

    def watch(self, pid):
        with self.cond:
            self.watched.add(pid)
            self.cond.notify_all()

    def run(self):
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                with self.cond:
                    self.cond.wait(0.5)
                continue
            with self.cond:
                self.statuses[pid] = os.waitstatus_to_exitcode(status)
                self.cond.notify_all()

    def wait(self, pid, timeout):
        """The exit code of `pid`, or None at the timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while pid not in self.statuses:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left)
            self.watched.discard(pid)
            code = self.statuses.pop(pid)
        return 128 - code if code < 0 else code  # killed by a signal: as bash reports it

    def forget_orphans(self):
        with self.cond:
            for pid in [p for p in self.statuses if p not in self.watched]:
                del self.statuses[pid]


REAPER = Reaper()


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


class HeadTail:
    """Keeps the first and last `limit // 2` bytes of a stream: a flood cannot fill memory.
    (Also used by the docker backend on the host; this file imports only the stdlib.)"""

    def __init__(self, limit):
        self.half = max(1, limit // 2)
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0

    def add(self, chunk):
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
        marker = f"\n[... {self.dropped} bytes cut ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


class CappedReader(threading.Thread):
    """Drains a pipe into a HeadTail."""

    def __init__(self, pipe, limit):
        super().__init__(daemon=True)
        self.pipe, self.kept = pipe, HeadTail(limit)

    def run(self):
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            self.kept.add(chunk)

    def value(self):
        return self.kept.value()


def run(request, base_env):
    """Run one command and reply; every failure still gets a reply."""
    started = time.monotonic()
    try:
        result = execute(request, base_env, started)
    except Exception as exc:  # noqa: BLE001 - e.g. no thread left at the pids limit: still a reply
        result = (126, False, b"", f"exec server: {exc}".encode())
    REAPER.forget_orphans()
    exit_code, timed_out, stdout, stderr = result
    reply(request["id"], exit_code, timed_out, time.monotonic() - started, stdout, stderr)


def execute(request, base_env, started):
    """(exit code, timed out, stdout, stderr) of one command."""
    env = dict(base_env)
    env.update(request.get("env") or {})
    limit = int(request.get("max_output") or 1000000)
    stdin_data = request.get("stdin")
    # Threads first, process second: a command that forks to the pids limit at once must not
    # leave us unable to start the threads that drain its output.
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    # Not closed here: each reader thread owns its pipe's file and reads it to EOF.
    readers = [CappedReader(open(out_read, "rb"), limit),  # noqa: SIM115
               CappedReader(open(err_read, "rb"), limit)]  # noqa: SIM115
    for reader in readers:
        reader.start()
    stdin_read = stdin_write = None
    if stdin_data is not None:
        stdin_read, stdin_write = os.pipe()
        # _feed owns the pipe's write end and closes it once the data is written.
        stdin_pipe = open(stdin_write, "wb")  # noqa: SIM115
        threading.Thread(target=_feed, args=(stdin_pipe, stdin_data), daemon=True).start()
    try:
        pid = spawn(request, env, stdin_read, out_write, err_write)
    except OSError as exc:
        return 127, False, b"", str(exc).encode()
    finally:
        for fd in (out_write, err_write, stdin_read):
            if fd is not None:
                os.close(fd)
    timeout = request.get("timeout")
    deadline = None if timeout is None else started + timeout
    exit_code = REAPER.wait(pid, timeout)
    timed_out = exit_code is None
    # Background children may hold the pipes open after the shell exits: wait for them only
    # until the timeout, then kill the whole group (a fork bomb ends here too).
    for reader in readers:
        reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if any(reader.is_alive() for reader in readers):
        timed_out = True
    if timed_out:
        _kill_group(pid)
        if exit_code is None:  # else the shell was reaped already; only its children lingered
            REAPER.wait(pid, None)
        for reader in readers:
            reader.join(2)  # a process that left the group may still hold a pipe
    return (-1 if timed_out else exit_code), timed_out, readers[0].value(), readers[1].value()


def spawn(request, env, stdin_fd, stdout_fd, stderr_fd):
    """Start a command in its own session; the reaper is told before it can exit unseen."""
    with REAPER.cond:  # hold the reaper off until the pid is watched
        proc = subprocess.Popen(
            ["/bin/bash", "-c", request["cmd"]], cwd=request.get("cwd") or None, env=env,
            stdin=subprocess.DEVNULL if stdin_fd is None else stdin_fd,
            stdout=stdout_fd, stderr=stderr_fd, start_new_session=True)
        REAPER.statuses.pop(proc.pid, None)  # a reused pid's stale status (not this process's:
        REAPER.watched.add(proc.pid)         # the reaper cannot record while we hold the lock)
        REAPER.cond.notify_all()
    # The reaper owns this child. A Popen dropped with no returncode goes on subprocess's list
    # of processes to poll, and the next Popen would reap it there, stealing its status.
    proc.returncode = REAPED_ELSEWHERE
    return proc.pid


def others():
    """Pids in this namespace other than ours."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def kill_all(request):
    """SIGKILL every other process of the namespace until none is left."""
    started = time.monotonic()
    left = others()
    for _ in range(400):
        if not left:
            break
        with contextlib.suppress(ProcessLookupError):  # none left to signal
            os.kill(-1, signal.SIGKILL)  # from PID 1: every process of the namespace but us
        time.sleep(0.005)
        left = others()
    reply(request["id"], 0 if not left else 1, False, time.monotonic() - started,
          b"%d left\n" % len(left))


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


def harden():
    """No ptrace, no fd theft (not dumpable), no signal handlers an agent could trigger."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)  # SIG_DFL on PID 1: dropped by the kernel


def main():
    deadline_s = float(sys.argv[1])
    harden()
    REAPER.start()
    # A timer thread, not SIGALRM: a handled signal is one an agent could send us.
    timer = threading.Timer(deadline_s, os._exit, args=(124,))
    timer.daemon = True
    timer.start()
    base_env = dict(os.environ)
    sys.stdout.buffer.write(b"ready %d\n" % os.getpid())
    sys.stdout.buffer.flush()
    while True:
        request = read_request(sys.stdin.buffer)
        if request is None:
            return
        target, args = (kill_all, (request,)) if request.get("op") == "killall" else (
            run, (request, base_env))
        try:
            threading.Thread(target=target, args=args, daemon=True).start()
        except RuntimeError as exc:  # no thread: the sandbox is out of processes
            reply(request["id"], 126, False, 0.0, stderr=str(exc).encode())


if __name__ == "__main__":
    main()
