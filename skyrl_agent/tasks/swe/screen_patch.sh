#!/bin/bash
# Screens the agent's patch before the verifier applies it (skyrl-agent, SWE-format tasks).
#   screen_patch.sh PATCH NAMES     run in the pristine /testbed, before any of the agent's code
# Prints `tampering: CLASS: PATH` and exits 3 at the first path of the never-taken set, exits 0
# when every path may be taken, exits 2 when git cannot read the patch. PATCH is read with the
# same parser that applies it (git apply), so the screen and the applier see the same paths.
# NAMES holds one module name a line: the test runner's own and the standard library's; a new
# module or package of such a name where Python looks first (the repo root, or a folder that is
# not a package in the base commit, which pytest puts on sys.path) would replace it.
set -uo pipefail
patch=$1 names=$2

git_() {
  GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
    git -c core.fsmonitor=false -c safe.directory="$PWD" "$@"
}
in_base() { git_ cat-file -e "HEAD:$1" 2>/dev/null; }

runner_config() {  # files pytest or Python read as configuration, at any depth
  case "/$1" in
    */pytest.ini | */.pytest.ini | */pytest.toml | */.pytest.toml | */tox.ini | */setup.cfg | \
    */pyproject.toml | */conftest.py) return 0 ;;
  esac
  return 1
}

plugin_autoload() {  # package metadata: entry points pytest loads, paths site adds
  case "/$1/" in
    *.dist-info/* | *.egg-info/* | *.egg-link/* | *.pth/* | */entry_points.txt/*) return 0 ;;
  esac
  return 1
}

interpreter_startup() {  # code Python runs at start-up or prefers to the patched source
  case "/$1/" in
    */sitecustomize.py/* | */usercustomize.py/* | */__pycache__/* | *.pyc/* | *.pyo/* | \
    *.so/* | *.pyd/*) return 0 ;;
  esac
  return 1
}

runner_shadowing() {  # a new top-level module named like the runner or the standard library
  local path=$1 dir="" part name
  while [ -n "$path" ]; do
    part=${path%%/*}
    name=${part%.py}
    if grep -qxF -- "$name" "$names" && ! in_base "${dir}${part}" &&
       { [ -z "$dir" ] || ! in_base "${dir}__init__.py"; }; then
      return 0
    fi
    [ "$part" = "$path" ] && break
    dir="${dir}${part}/" path=${path#*/}
  done
  return 1
}

paths() {  # every path the patch names (both sides of a rename), NUL-separated
  git_ apply --numstat -z "$patch" | while IFS= read -r -d '' record; do
    if [ "${record##*$'\t'}" = "" ]; then  # a rename: the two names follow
      IFS= read -r -d '' from; IFS= read -r -d '' to; printf '%s\0%s\0' "$from" "$to"
    else
      printf '%s\0' "${record#*$'\t'*$'\t'}"
    fi
  done
}

listed=$(mktemp) || exit 2
trap 'rm -f "$listed"' EXIT
git_ apply --numstat -z "$patch" > /dev/null || exit 2
paths > "$listed" || exit 2
while IFS= read -r -d '' path; do
  for class in runner_config plugin_autoload interpreter_startup runner_shadowing; do
    if "$class" "$path"; then
      printf 'tampering: %s: %q\n' "${class//_/-}" "$path"
      exit 3
    fi
  done
done < "$listed"
exit 0
