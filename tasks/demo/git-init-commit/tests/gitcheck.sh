# Sourced by test.sh: read an agent's git repository without running anything it chose.
#
# Git follows files of a repository to configuration, refs and objects elsewhere (commondir,
# objects/info/alternates, info/grafts, shallow, refs/replace, a config that is a link), and a
# configuration can name programs git runs while it only reads (gpg.program with
# log.showSignature, core.fsmonitor, core.pager, diff.external, textconv). The verifier runs as
# root, so such a program could write the reward. Hence git only ever sees a snapshot holding
# HEAD, refs/, packed-refs, objects/ (and the index, for `status`) copied as regular files and
# folders, with a configuration written here, and runs with nothing from the environment.
#
# Why git on a snapshot and not a reader of objects without git: the verifier runs in the task's
# own image, which has git and python3 but no git library (dulwich, pygit2), and a reader of
# packs and deltas written here would be more code to trust than git with a fixed setup.
# `git fsck --full` rehashes every object, so an object file cannot claim another's id.

# git_snapshot GITDIR: snapshot GITDIR into GITCHECK; 1 (and GITCHECK empty) when refused.
git_snapshot() {
    GITCHECK=/nonexistent
    GITCHECK_HOME=$(mktemp -d) && GITCHECK=$(mktemp -d) || return 1
    if ! _git_copy "$1" "$GITCHECK" || ! gitc fsck --full --no-dangling --no-progress \
            >/dev/null; then
        rm -rf -- "$GITCHECK"
        GITCHECK=/nonexistent
        return 1
    fi
}

_git_copy() {
    local src=$1 dst=$2 top
    for top in "" /HEAD /refs /objects; do  # links at the top are refused, never followed
        [ -e "$src$top" ] && [ ! -L "$src$top" ] || return 1
    done
    [ -f "$src/HEAD" ] && [ -d "$src/refs" ] && [ -d "$src/objects" ] || return 1
    cp -P -- "$src/HEAD" "$dst/" && cp -R -P -- "$src/refs" "$src/objects" "$dst/" || return 1
    for top in packed-refs index; do
        if [ -f "$src/$top" ] && [ ! -L "$src/$top" ]; then
            cp -P -- "$src/$top" "$dst/" || return 1
        fi
    done
    # Replacements and alternates, commit graphs and multi-pack indexes: history git would not
    # read from the objects themselves. Then every link, fifo or device copied below the top.
    rm -rf -- "$dst/refs/replace" "$dst/objects/info" "$dst/objects/pack/multi-pack-index" &&
        find "$dst" ! -type f ! -type d -delete &&
        printf '[core]\n\trepositoryformatversion = 0\n\tbare = true\n' > "$dst/config"
}

# gitc ARG...: git on the snapshot, configured by these lines alone (--work-tree for status).
gitc() {
    env -i PATH=/usr/bin:/bin LC_ALL=C HOME="$GITCHECK_HOME" GIT_DIR="$GITCHECK" \
        GIT_CEILING_DIRECTORIES=/ GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
        GIT_ATTR_NOSYSTEM=1 GIT_NO_REPLACE_OBJECTS=1 GIT_PAGER=cat PAGER=cat \
        GIT_OPTIONAL_LOCKS=0 GIT_TERMINAL_PROMPT=0 \
        git --no-pager -c core.fsmonitor=false -c core.hooksPath=/dev/null \
        -c core.attributesFile=/dev/null -c log.showSignature=false -c safe.directory='*' \
        "$@" 2>/dev/null
}
