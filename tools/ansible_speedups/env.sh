# Opt-in controller speed-ups for ansible-playbook runs of this checkout (docs/performance.md, "Opt-in speed-ups"):
#   . tools/ansible_speedups/env.sh
# The collection and the project's ansible.cfg use public ansible-core APIs only. These two plugins use private ones
# and are tested on ansible-core 2.19 only; on any other version each warns and does nothing special:
#   ansiballz_cache    keeps ansible-core's module builds (with bytecode) from one run to the next
#   gpufleet_jsonfile  ansible.builtin.jsonfile's fact files, each host's decoded once per run, not once per task
# Nothing sources it by default: not `make test`, `make deploy` or the documented commands (they run what users run).
_gpufleet_speedups="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export ANSIBLE_CALLBACK_PLUGINS="$_gpufleet_speedups/callback_plugins${ANSIBLE_CALLBACK_PLUGINS:+:$ANSIBLE_CALLBACK_PLUGINS}"
export ANSIBLE_CACHE_PLUGINS="$_gpufleet_speedups/cache_plugins${ANSIBLE_CACHE_PLUGINS:+:$ANSIBLE_CACHE_PLUGINS}"
export ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks,ansiballz_cache"
export ANSIBLE_CACHE_PLUGIN=gpufleet_jsonfile
unset _gpufleet_speedups
