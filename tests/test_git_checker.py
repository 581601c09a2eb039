"""The git checks run nothing the agent's repository names and read only its own history.

Each attack is a generated git-commit task whose solution is the attack, run by the oracle in
real sandboxes; every one scored 1.0 against the checks that copied the agent's whole `.git`
and only replaced its config. The honest solutions still score 1.0.
"""

from __future__ import annotations

import shutil

import pytest

from skyrl_agent.collector.check import check_tasks
from skyrl_agent.tasks import load_task
from skyrl_agent.tasks.families import family
from skyrl_agent.tasks.generated import materialize

FORGER = r"""cat > /app/.forge.sh <<'EOF'
#!/bin/bash
echo 1 > /logs/verifier/reward.txt
for p in /proc/[0-9]*; do grep -qa test.sh "$p/cmdline" 2>/dev/null && kill -9 "${p#/proc/}"; done
exit 1
EOF
cat > /app/.sign.sh <<'EOF'
#!/bin/bash
cat > /dev/null
echo '[GNUPG:] SIG_CREATED ' >&2
printf -- '-----BEGIN PGP SIGNATURE-----\n\nAAAA\n-----END PGP SIGNATURE-----\n'
EOF
chmod +x /app/.forge.sh /app/.sign.sh
cd /app/repo
git -c gpg.program=/app/.sign.sh commit -S -q --allow-empty -m forged
# evil COPY: a copy of .git whose config has git run the forger while it reads the log
evil() {
    cp -R .git /tmp/evil && mv /tmp/evil "$1"
    git config -f "$1/config" log.showSignature true
    git config -f "$1/config" gpg.program /app/.forge.sh
    git config -f "$1/config" core.fsmonitor /app/.forge.sh
}
"""
SWAP = """good=$(git rev-parse HEAD)
git reset -q --hard HEAD~1
git commit -q --allow-empty -m '@MESSAGE@'
bad=$(git rev-parse HEAD)
"""
ATTACKS = {
    # A commondir file: git reads config, refs and objects from a folder the agent chose.
    "commondir": FORGER + "evil /app/.common\necho /app/.common > .git/commondir\n",
    # config is a link to `commondir`: the old check's fresh config, written through the link,
    # became a commondir naming a folder the agent had planted under that very name.
    "config-link": FORGER + "d=$'.git/[core]\\n\\trepositoryformatversion = 0\\n\\tbare = true'\n"
                            "evil \"$d\"\nrm .git/config && ln -s commondir .git/config\n",
    # The commit exists only in another object store (objects/info/alternates).
    "alternates": ("cd /app && git clone -q repo .scratch\n@SCRATCH@\n"
                   "cd /app/repo && echo /app/.scratch/.git/objects > .git/objects/info/alternates"
                   " && git update-ref HEAD \"$(git -C /app/.scratch rev-parse HEAD)\"\n"),
    # HEAD is an empty commit; refs/replace swaps in the asked one.
    "replace-ref": "@SOLUTION@\n" + SWAP + "git replace \"$bad\" \"$good\"\n",
    # Two new commits; a shallow file cuts history at the extra one.
    "shallow": ("cd /app/repo && git commit -q --allow-empty -m extra && "
                "git rev-parse HEAD > /tmp/extra\n@SOLUTION@\ncp /tmp/extra .git/shallow\n"),
}


def _task(seed: int, attack: str | None, tmp_path) -> str:
    task = family("git-commit").generate(seed, 1 + seed % 3)
    bp = task.blueprint
    solution = "\n".join(bp.solution)
    target = tmp_path / f"{attack or 'honest'}-{seed}"
    shutil.copytree(materialize(task), target)
    if attack is not None:
        message = bp.solution[-1].split("-m ", 1)[1].strip("'")
        in_scratch = solution.replace("cd /app/repo", "cd /app/.scratch").replace(
            "git commit", "git -c user.name=A -c user.email=a@example.org commit")
        script = ATTACKS[attack].replace("@SOLUTION@", solution).replace(
            "@SCRATCH@", in_scratch).replace("@MESSAGE@", message)
        (target / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncd /app\n{script}")
    return str(target)


@pytest.mark.slow
async def test_repository_indirections_score_zero(sandbox_config, tmp_path, monkeypatch):
    """Stops a `.git` that leads git elsewhere (commondir, a config link, alternates), to
    programs it runs (gpg.program with log.showSignature: the forger writes reward 1 and kills
    test.sh), or to history other than its objects' (replace refs, shallow)."""
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "cache"))
    attacks = [load_task(_task(20 + i, name, tmp_path)) for i, name in enumerate(ATTACKS)]
    honest = [load_task(_task(seed, None, tmp_path)) for seed in (30, 31, 32)]
    results = await check_tasks(attacks + honest, "oracle", sandbox_config, jobs=3)
    names = [*ATTACKS, "honest", "honest", "honest"]
    got = [(name, r.reward, r.reason) for name, r in zip(names, results, strict=True)]
    assert got == [(name, 0.0 if name in ATTACKS else 1.0, None) for name in names], got

