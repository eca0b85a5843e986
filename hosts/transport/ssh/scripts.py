"""Every command the SSH transport sends: constant ``sh -c`` scripts and ``python3 -c`` programs.

SSH carries a command line, not an argv, so nothing variable is ever spliced into a script:
``sh(script, *args)`` passes the variable parts as positional arguments (``$1 …``), each word
quoted with ``shlex.join``, and the remote login shell turns the line back into that argv.
Scripts that print several things print them as sections: a ``<marker> name`` line, then the
body (see ``parsing.sections``); the marker is random per call, so no file content can forge one.
"""

from __future__ import annotations

import shlex


def sh(script: str, *args: object) -> str:
    """A command line running the constant ``script`` with ``args`` as ``$1 …``, every word
    quoted: the remote login shell turns it back into exactly this argv."""
    return shlex.join(["sh", "-c", script, "sh", *(str(a) for a in args)])


# The engine directory listing every status, telemetry and info call reads. Variables: m
# (section marker), r (remote dir), one (one engine name, or empty for all).
ENGINE_FILES = r"""
if [ -n "$one" ]; then set -- "$r/$one/"; else set -- "$r"/*/; fi
for d in "$@"; do
  [ -f "${d}config.json" ] || [ -f "${d}state.json" ] || continue
  n=${d%/}; n=${n##*/}
  echo "$m engine"; echo "$n"
  p=$(cat "${d}engine.pid" 2>/dev/null)
  echo "$m pid"; echo "$p"
  case "$p" in
    ''|*[!0-9]*) ;;
    *) echo "$m stat"; cat "/proc/$p/stat" 2>/dev/null
       echo "$m cpus"; sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null;;
  esac
  # The echo after each file: one without a final newline must not swallow the next marker.
  echo "$m state"; cat "${d}state.json" 2>/dev/null; echo
  echo "$m config"; cat "${d}config.json" 2>/dev/null; echo
done
"""
ENGINE_FILES_SCRIPT = "m=$1; r=$2; one=$3\n" + ENGINE_FILES

# $1 marker, $2 nvidia-smi, $3 remote dir, $4 python, $5 LIBRARIES_PY, then package names.
INFO_SCRIPT = (
    r"""m=$1; smi=$2; r=$3; py=$4; code=$5; shift 5; one=
echo "$m hostname"; cat /proc/sys/kernel/hostname
echo "$m smi"; command -v "$smi" || true
echo "$m libraries"; "$py" -c "$code" "$@" 2>/dev/null; echo
"""
    + ENGINE_FILES
)

# $1 engine dir, $2 working directory, then the engine's argv. The inner shell records its own
# pid (which ``exec`` hands to the engine: pid = process group = session), loads the 0600 env
# file and becomes the engine; stdin/stdout/stderr are redirected so the SSH session can end.
START_SCRIPT = r"""
d=$1; w=$2; shift 2
[ ! -f "$d/engine.log" ] || mv -f "$d/engine.log" "$d/engine.log.1"
rm -f "$d/engine.pid"
cd "$w" || { echo "the working directory $w does not exist" >&2; exit 97; }
setsid nohup sh -c \
  'echo $$ > "$1/engine.pid" && set -a && . "$1/env" && set +a && shift && exec "$@"' \
  llm-engine "$d" "$@" > "$d/engine.log" 2>&1 < /dev/null &
i=0
while [ ! -s "$d/engine.pid" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
p=$(cat "$d/engine.pid" 2>/dev/null)
[ -n "$p" ] || { echo "the engine did not start" >&2; exit 98; }
echo "$p"
# An engine that refuses its config may already be gone (and reaped): no stat line then, and
# the readiness wait reports how it ended, with its log. Not a failure of starting it.
cat "/proc/$p/stat" 2>/dev/null || true
"""

# $1 pid (= process group), $2 grace period in tenths of a second: TERM to the whole group
# (engines fork workers), KILL to whatever is left after the grace period. "Left" means a
# member that is not a zombie: where init does not reap (some containers), a dead engine stays
# a zombie, and `kill -0` would keep answering for it. (`kill -SIG -PGID`, without `--`: dash's
# kill refuses `--`.)
STOP_SCRIPT = r"""
p=$1; n=$2
alive() { grep -qs -e ") [^ZX] [0-9]* $p " /proc/[0-9]*/stat; }
alive || exit 0
kill -TERM "-$p" 2>/dev/null
i=0
while alive; do
  if [ "$i" -ge "$n" ]; then kill -KILL "-$p" 2>/dev/null; echo killed; sleep 0.2; break; fi
  sleep 0.1; i=$((i+1))
done
"""

TAIL_SCRIPT = 'tail -n "$1" "$2" 2>/dev/null || true'
MKDIR_SCRIPT = 'umask 077 && mkdir -p "$1"'
# $1 pid: the CPUs it may run on (for styles whose engine's pid is not ours to read in a file).
CPUS_SCRIPT = 'sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" "/proc/$1/status" 2>/dev/null'

# $1 marker, $2 nvidia-smi, $3 GPU query, $4 legacy GPU query, $5 apps query, $6 format,
# $7 remote dir, $8 "inventory" for the slower, rarer extras.
TELEMETRY_SCRIPT = (
    r"""
m=$1; smi=$2; r=$7; one=
echo "$m hostname"; cat /proc/sys/kernel/hostname
echo "$m loadavg"; cat /proc/loadavg
echo "$m meminfo"; cat /proc/meminfo
echo "$m stat1"; head -n 1 /proc/stat
if command -v "$smi" >/dev/null 2>&1; then
  o=$("$smi" "$3" "$6" 2>&1); rc=$?
  case "$o" in *"is not a valid field"*) o=$("$smi" "$4" "$6" 2>&1); rc=$?; echo "$m legacy";; esac
  echo "$m gpus"; printf '%s\n' "$o"
  echo "$m gpus-rc"; echo "$rc"
  if [ "$rc" -eq 0 ]; then echo "$m apps"; "$smi" "$5" "$6" 2>/dev/null; fi
  if [ "$8" = inventory ]; then echo "$m smi"; "$smi" 2>/dev/null | head -n 5; fi
else
  echo "$m no-smi"
fi
sleep 0.2
echo "$m stat2"; head -n 1 /proc/stat
if [ "$8" = inventory ]; then
  echo "$m nproc"; getconf _NPROCESSORS_ONLN
  echo "$m cpuinfo"; grep -m 1 -i '^model name' /proc/cpuinfo
  echo "$m nodes"
  for f in /sys/devices/system/node/node[0-9]*; do
    [ -r "$f/cpulist" ] && echo "${f##*/node} $(cat "$f/cpulist")"
  done
fi
"""
    + ENGINE_FILES
)

# $1 marker, then sysfs PCI addresses (validated): NUMA node and local CPUs of each GPU.
PCI_SCRIPT = r"""
m=$1; shift
for a in "$@"; do
  echo "$m $a"
  cat "/sys/bus/pci/devices/$a/numa_node" 2>/dev/null || echo
  cat "/sys/bus/pci/devices/$a/local_cpulist" 2>/dev/null || echo
done
"""

# Versions of the engines' Python packages in the host's interpreter (the agent's /v1/info
# "libraries"). This program runs on the host, whose Python may predate importlib.metadata
# (3.8): the guarded import is that check, so it prints {} there instead of a traceback.
LIBRARIES_PY = """\
import json, sys
try:
    from importlib import metadata
except ImportError:
    metadata = None
found = {}
for name in sys.argv[1:] if metadata else ():
    try:
        found[name] = metadata.version(name)
    except Exception:
        pass
sys.stdout.write(json.dumps(found))
"""

# Readiness probe for servers that refuse TCP forwarding: the same GET from the host itself.
# Proxies are switched off: the engine is on the host's own loopback. Prints the status (0 when
# nothing answered) on the first line, then the body.
HTTP_GET_PY = """\
import sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(sys.argv[1], timeout=float(sys.argv[2]))
    status, body = r.status, r.read(4194304)
except urllib.error.HTTPError as e:
    status, body = e.code, e.read(65536)
except Exception:
    status, body = 0, b""
sys.stdout.write(str(status) + "\\n")
sys.stdout.flush()
sys.stdout.buffer.write(body)
"""
