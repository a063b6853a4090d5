#!/bin/sh
# drover-agent.sh: the Drover device agent in POSIX sh and curl, for devices
# where the Go binary is too big. Same protocol, hook and collector contracts
# as `drover agent`; see docs/agent.md.
set -u

AGENT_VERSION=1.0

SERVER=
SECRET=
ENROLL_TOKEN=
SECRET_FILE=
STATE_DIR=/var/lib/drover-agent
CA_CERT=
PIN=
ALLOW_HTTP=0
HOOK=
HOOK_TIMEOUT=300
HOOK_RETRY=1800
COLLECTOR=
COLLECTOR_TIMEOUT=20
DEVICE_TYPE=
MODEL=
SERIAL=
FIRMWARE=
MACHINE_ID_ARG=
IDENTITY_SCRIPT=
PRINT_MACHINE_ID=0
ROOT=
DISK_PATH=/
INTERFACES=
MIN_BACKOFF=2
MAX_BACKOFF=300
ENROLL_RETRY=600
TIMEOUT=30
ONCE=0
LOG_LEVEL=info
COMMANDS=ping,read-log,set-config,hook
COMMAND_HOOK=
LOGS=
REBOOT_COMMAND=/sbin/reboot
FW_HOOK=
FW_HOOK_TIMEOUT=1800
FW_KEY=

usage() {
	cat <<'EOF'
usage: drover-agent.sh --server URL --enroll-secret S [flags]

Registers this device with a Drover server, pushes its state every interval
and applies the configuration the server sends through --hook.
Durations are seconds, or a number with s, m or h.

flags:
  --server URL              server URL, https://host:port (required)
  --enroll-secret S         enrollment secret (needed to register)
  --enroll-secret-file F    file holding the enrollment secret
  --enroll-token T          single-use enrollment token an operator made for this device
  --state-dir D             machine ID, token, sequence, applied config (default /var/lib/drover-agent)
  --ca-cert F               PEM of the CA or of the server's self-signed certificate to trust
  --pin-pubkey sha256//B64  trust only this server public key; alone it replaces CA checks
  --allow-http              allow an http:// server URL (token sent in clear)
  --hook CMD                shell command applying a configuration: JSON on stdin, exit 0 when applied
  --hook-timeout T          kill the hook after T (default 300)
  --hook-retry T            retry a failed configuration version after T; 0: only new versions (default 1800)
  --collector CMD           shell command printing key=value lines (rssi, rsrp, rsrq, sinr, operator, technology, extras)
  --collector-timeout T     kill the collector after T (default 20)
  --device-type S           device type to register with (default: openwrt or the os-release ID)
  --model S                 model (default: from /tmp/sysinfo, device tree or DMI)
  --serial S                serial number (default: from device tree or DMI)
  --firmware S              firmware (default: from /etc/openwrt_release or /etc/os-release)
  --machine-id S            machine ID (default: derived once from the hardware, kept in the state directory)
  --identity-script CMD     shell command printing this device's identity (e.g. a serial number) on its
                            first line; a new state directory's machine ID is derived from it
  --print-machine-id        print the machine ID this agent registers with and exit
  --root D                  read /proc, /sys and /etc under D (for tests)
  --disk-path P             file system whose usage is reported (default /; /overlay on OpenWrt)
  --interfaces LIST         comma-separated glob patterns of interfaces (default: all but lo)
  --min-backoff T           first retry delay after an error (default 2)
  --max-backoff T           longest retry delay (default 300)
  --enroll-retry T          wait after a rejected enrollment secret (default 600)
  --timeout T               timeout of one request (default 30)
  --commands LIST           remote command kinds this device runs, comma-separated: reboot, ping,
                            read-log, set-config, hook; empty: none (default ping,read-log,set-config,hook)
  --command-hook PATH       executable run (no shell) for set-config and hook commands: argv
                            set-config KEY VALUE, or hook ARGS...
  --logs LIST               logs read-log may read: comma-separated NAME=PATH
  --reboot-command CMD      program and arguments (split at spaces, no shell) of the reboot command (default /sbin/reboot)
  --firmware-hook CMD       shell command installing $DROVER_FIRMWARE_FILE; empty: firmware offers fail
  --firmware-hook-timeout T kill the firmware hook after T (default 1800)
  --firmware-key F          ed25519 public key (PEM or 32 bytes in base64) firmware must be signed with;
                            needs openssl 3; empty: signatures are not checked
  --once                    register if needed, push once (and report an applied configuration), exit
  --log-level L             debug, info, warn or error (default info)
  --help                    this text
EOF
}

log() {
	_lv=$1
	shift
	case $LOG_LEVEL:$_lv in
	info:debug | warn:debug | warn:info | error:debug | error:info | error:warn) return 0 ;;
	esac
	printf '%s drover-agent %s: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$_lv" "$*" >&2
}

die() {
	log error "$*"
	exit 1
}

# seconds converts 30, 30s, 5m or 1h to seconds.
seconds() {
	case $1 in
	'' | *[!0-9smh]* | *[smh]*[0-9smh]*) return 1 ;;
	*s) echo "${1%s}" ;;
	*m) echo $((${1%m} * 60)) ;;
	*h) echo $((${1%h} * 3600)) ;;
	*) echo "$1" ;;
	esac
}

while [ $# -gt 0 ]; do
	opt=$1
	val=
	case $opt in
	--*=*)
		val=${opt#*=}
		opt=${opt%%=*}
		;;
	--allow-http | --once | --print-machine-id | --help | -h) ;;
	--*)
		[ $# -ge 2 ] || {
			echo "drover-agent.sh: $opt needs a value" >&2
			exit 2
		}
		val=$2
		shift
		;;
	esac
	shift
	case $opt in
	--server) SERVER=$val ;;
	--enroll-secret) SECRET=$val ;;
	--enroll-secret-file) SECRET_FILE=$val ;;
	--enroll-token) ENROLL_TOKEN=$val ;;
	--state-dir) STATE_DIR=$val ;;
	--ca-cert) CA_CERT=$val ;;
	--pin-pubkey) PIN=$val ;;
	--allow-http) ALLOW_HTTP=1 ;;
	--hook) HOOK=$val ;;
	--hook-timeout) HOOK_TIMEOUT=$val ;;
	--hook-retry) HOOK_RETRY=$val ;;
	--collector) COLLECTOR=$val ;;
	--collector-timeout) COLLECTOR_TIMEOUT=$val ;;
	--device-type) DEVICE_TYPE=$val ;;
	--model) MODEL=$val ;;
	--serial) SERIAL=$val ;;
	--firmware) FIRMWARE=$val ;;
	--machine-id) MACHINE_ID_ARG=$val ;;
	--identity-script) IDENTITY_SCRIPT=$val ;;
	--print-machine-id) PRINT_MACHINE_ID=1 ;;
	--root) ROOT=${val%/} ;;
	--disk-path) DISK_PATH=$val ;;
	--interfaces) INTERFACES=$val ;;
	--min-backoff) MIN_BACKOFF=$val ;;
	--max-backoff) MAX_BACKOFF=$val ;;
	--enroll-retry) ENROLL_RETRY=$val ;;
	--timeout) TIMEOUT=$val ;;
	--once) ONCE=1 ;;
	--log-level) LOG_LEVEL=$val ;;
	--commands) COMMANDS=$val ;;
	--command-hook) COMMAND_HOOK=$val ;;
	--logs) LOGS=$val ;;
	--reboot-command) REBOOT_COMMAND=$val ;;
	--firmware-hook) FW_HOOK=$val ;;
	--firmware-hook-timeout) FW_HOOK_TIMEOUT=$val ;;
	--firmware-key) FW_KEY=$val ;;
	--help | -h)
		usage
		exit 0
		;;
	*)
		echo "drover-agent.sh: unknown flag $opt" >&2
		usage >&2
		exit 2
		;;
	esac
done

_s=
for _v in HOOK_TIMEOUT HOOK_RETRY COLLECTOR_TIMEOUT FW_HOOK_TIMEOUT MIN_BACKOFF MAX_BACKOFF ENROLL_RETRY TIMEOUT; do
	eval "_s=\$$_v"
	_n=$(seconds "$_s") || die "$_v: '$_s' is not a duration"
	eval "$_v=$_n"
done
case $LOG_LEVEL in debug | info | warn | error) ;; *) die "--log-level must be debug, info, warn or error" ;; esac
[ -n "$SERVER" ] || [ "$PRINT_MACHINE_ID" = 1 ] || die "--server is required"
SERVER=${SERVER%/}
case $PRINT_MACHINE_ID:$SERVER in
1:* | 0:https://?*) ;;
0:http://?*) [ "$ALLOW_HTTP" = 1 ] || die "--server uses http://, which sends the token in clear; use https:// or pass --allow-http" ;;
*) die "--server must be an https:// URL" ;;
esac
[ "$MIN_BACKOFF" -ge 1 ] && [ "$MAX_BACKOFF" -ge "$MIN_BACKOFF" ] || die "--max-backoff must be at least --min-backoff, which must be at least 1"
[ "$TIMEOUT" -ge 1 ] || die "--timeout must be at least 1"
if [ -n "$SECRET_FILE" ]; then
	[ -z "$SECRET" ] || die "--enroll-secret and --enroll-secret-file exclude each other"
	SECRET=$(tr -d ' \r\n\t' <"$SECRET_FILE") || die "cannot read $SECRET_FILE"
fi
[ -z "$CA_CERT" ] || [ -r "$CA_CERT" ] || die "--ca-cert $CA_CERT is not readable"
command -v curl >/dev/null 2>&1 || [ "$PRINT_MACHINE_ID" = 1 ] || die "curl is required"
COMMANDS=$(printf '%s' "$COMMANDS" | tr -d ' ')
for _k in $(printf '%s' "$COMMANDS" | tr ',' ' '); do
	case $_k in reboot | ping | read-log | set-config | hook) ;; *) die "--commands: unknown kind '$_k' (known: reboot, ping, read-log, set-config, hook)" ;; esac
done
[ -z "$COMMAND_HOOK" ] || [ -x "$COMMAND_HOOK" ] || log warn "--command-hook $COMMAND_HOOK is not executable"

umask 077
[ "$PRINT_MACHINE_ID" = 1 ] || mkdir -p "$STATE_DIR" || die "cannot create $STATE_DIR"
RUN=$(mktemp -d "${TMPDIR:-/tmp}/drover-agent.XXXXXX") || die "cannot create a directory in ${TMPDIR:-/tmp}"
CHILD=
FW_PID= # the background firmware download
MAIN_PID=$$
WOKE=0

cleanup() {
	[ -z "$CHILD" ] || kill "$CHILD" 2>/dev/null
	[ -z "$FW_PID" ] || kill "$FW_PID" 2>/dev/null
	rm -rf "$RUN"
}
trap 'cleanup; exit 0' TERM INT HUP
trap 'cleanup' EXIT
trap 'WOKE=1' USR1 # a firmware download ended: push now

# bg_wait runs a command in the background and waits, so that TERM is
# handled at once. Background commands read /dev/null unless told: stdin
# comes from the file BG_IN. A USR1 does not end the wait.
BG_IN=/dev/null
bg_wait() {
	"$@" <"$BG_IN" &
	CHILD=$!
	while :; do
		wait "$CHILD"
		_rc=$?
		[ $_rc -gt 128 ] && kill -0 "$CHILD" 2>/dev/null || break
	done
	CHILD=
	return $_rc
}

# run_limited SECONDS CMD...: runs CMD, killed after SECONDS when a timeout
# tool exists (busybox before 1.30 wants -t).
TIMEOUT_STYLE=
run_limited() {
	_secs=$1
	shift
	if [ -z "$TIMEOUT_STYLE" ]; then
		if timeout 5 true >/dev/null 2>&1; then
			TIMEOUT_STYLE=plain
		elif timeout -t 5 true >/dev/null 2>&1; then
			TIMEOUT_STYLE=t
		else
			TIMEOUT_STYLE=none
			log warn "no timeout command: hooks and collectors run without a time limit"
		fi
	fi
	case $TIMEOUT_STYLE in
	plain) bg_wait timeout "$_secs" "$@" ;;
	t) bg_wait timeout -t "$_secs" "$@" ;;
	*) bg_wait "$@" ;;
	esac
}

# --- machine identity ------------------------------------------------------

# derive_machine_id sets MACHINE_ID and MID_SOURCE the way the Go agent's
# DeriveMachineID does (internal/agent/identity.go; a test compares them):
# from the first line the identity script prints (a failing script is an
# error), else the DMI product UUID, /etc/machine-id, the permanent MAC of the
# first physical interface, as hw- and the first 32 hex digits of
# SHA-256("SOURCE:VALUE"); else 128 random bits.
HX='[0-9a-f]'
idline() { # the first line of a file, lower case, NULs and outer blanks removed
	[ -r "$1" ] || return 0
	LC_ALL=C awk 'NR == 1 { gsub(/\000/, ""); sub(/^[ \t\r]+/, ""); sub(/[ \t\r]+$/, ""); print tolower($0); exit }' "$1" 2>/dev/null
}
derive_machine_id() {
	MID_SOURCE=
	_val=
	if [ -n "$IDENTITY_SCRIPT" ]; then
		run_limited 30 sh -c "$IDENTITY_SCRIPT" >"$RUN/identity.out" 2>"$RUN/identity.err"
		_rc=$?
		if [ $_rc -ne 0 ]; then
			log error "identity script exited with status $_rc: $(tail -n 1 "$RUN/identity.err")"
			return 1
		fi
		_val=$(LC_ALL=C awk 'NR == 1 { sub(/^[ \t\r]+/, ""); sub(/[ \t\r]+$/, ""); print; exit }' "$RUN/identity.out")
		[ -n "$_val" ] || {
			log error "identity script printed nothing"
			return 1
		}
		MID_SOURCE=script
	fi
	if [ -z "$MID_SOURCE" ]; then
		_val=$(idline "$ROOT/sys/class/dmi/id/product_uuid")
		# shellcheck disable=SC2254 # HX is a pattern
		case $_val in
		03000200-0400-0500-0006-000700080009) ;;
		$HX$HX$HX$HX$HX$HX$HX$HX-$HX$HX$HX$HX-$HX$HX$HX$HX-$HX$HX$HX$HX-$HX$HX$HX$HX$HX$HX$HX$HX$HX$HX$HX$HX)
			case $_val in *[!0-]*) case $_val in *[!f-]*) MID_SOURCE=dmi ;; esac ;; esac
			;;
		esac
	fi
	if [ -z "$MID_SOURCE" ]; then
		_val=$(idline "$ROOT/etc/machine-id")
		case $_val in
		*[!0-9a-f]*) ;;
		*[!0]*) [ ${#_val} -eq 32 ] && MID_SOURCE=machine-id ;;
		esac
	fi
	if [ -z "$MID_SOURCE" ]; then
		_val=$(for _d in "$ROOT"/sys/class/net/*; do
			_n=${_d##*/}
			[ "$_n" != lo ] && [ ! -e "$ROOT/sys/devices/virtual/net/$_n" ] || continue
			[ "$(idline "$_d/addr_assign_type")" = 0 ] || continue
			_m=$(idline "$_d/address")
			# shellcheck disable=SC2254 # HX is a pattern
			case $_m in
			00:00:00:00:00:00 | ff:ff:ff:ff:ff:ff) ;;
			$HX$HX:$HX$HX:$HX$HX:$HX$HX:$HX$HX:$HX$HX) printf '%s %s\n' "$_n" "$_m" ;;
			esac
		done | LC_ALL=C sort | head -n 1)
		_val=${_val#* }
		[ -z "$_val" ] || MID_SOURCE=mac
	fi
	MACHINE_ID=
	if [ -n "$MID_SOURCE" ]; then
		if command -v sha256sum >/dev/null 2>&1; then
			MACHINE_ID=$(printf '%s:%s' "$MID_SOURCE" "$_val" | sha256sum 2>/dev/null | cut -c1-32)
		elif command -v openssl >/dev/null 2>&1; then
			MACHINE_ID=$(printf '%s:%s' "$MID_SOURCE" "$_val" | openssl dgst -sha256 -r 2>/dev/null | cut -c1-32)
		fi
		case $MACHINE_ID in
		*[!0-9a-f]* | '') log warn "neither sha256sum nor openssl works: the machine ID is random, not derived from the hardware" ;;
		*) [ ${#MACHINE_ID} -eq 32 ] && MACHINE_ID=hw-$MACHINE_ID || MACHINE_ID= ;;
		esac
	fi
	if [ -z "$MACHINE_ID" ]; then
		MID_SOURCE=random
		MACHINE_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
		[ ${#MACHINE_ID} -eq 32 ] || die "cannot read /dev/urandom"
	fi
}

if [ "$PRINT_MACHINE_ID" = 1 ]; then
	MACHINE_ID=$MACHINE_ID_ARG
	[ -n "$MACHINE_ID" ] || [ ! -f "$STATE_DIR/machine-id" ] || read -r MACHINE_ID <"$STATE_DIR/machine-id"
	[ -n "$MACHINE_ID" ] || derive_machine_id || exit 1
	printf '%s\n' "$MACHINE_ID"
	exit 0
fi

# sleep_s sleeps, or less when a firmware download ends (USR1).
sleep_s() {
	[ "$1" -gt 0 ] 2>/dev/null || return 0
	[ "$WOKE" = 0 ] || {
		WOKE=0
		return 0
	}
	log debug "sleeping $1 s"
	sleep "$1" &
	CHILD=$!
	wait "$CHILD"
	kill "$CHILD" 2>/dev/null
	CHILD=
	WOKE=0
}

# rand N prints a random integer in 0..N.
rand() {
	_r=$(od -An -N2 -tu2 /dev/urandom 2>/dev/null | tr -d ' \n')
	[ -n "$_r" ] || _r=$(($$ + $(date +%s)))
	echo $((_r % ($1 + 1)))
}

NL='
'
TAB=$(printf '\t')

# --- JSON ------------------------------------------------------------------

# AWK_JSTR is an awk function: jstr(s, max) is s as a JSON string of at most
# max bytes. Control characters become spaces and non-ASCII bytes are
# dropped, so the server never sees invalid UTF-8.
AWK_JSTR='
function jstr(s, max,    o, i, c) {
	gsub(/[\t\r\n]/, " ", s)
	gsub(/[^ -~]/, "", s)
	s = substr(s, 1, max)
	o = ""
	for (i = 1; i <= length(s); i++) {
		c = substr(s, i, 1)
		if (c == "\\" || c == "\"") o = o "\\"
		o = o c
	}
	return "\"" o "\""
}'

# js VALUE MAX sets JS to VALUE as a JSON string (see jstr). Plain values
# take no subprocess.
JS=
js() {
	case $1 in
	*[!A-Za-z0-9\ ._:/@+,=\(\)#-]*) ;;
	*)
		if [ ${#1} -le "$2" ]; then
			JS="\"$1\""
			return
		fi
		;;
	esac
	JS=$(printf '%s' "$1" | LC_ALL=C awk -v max="$2" "$AWK_JSTR"'
		{ s = s (NR > 1 ? " " : "") $0 } END { print jstr(s, max) }')
}

# clean VALUE MAX sets CLEAN to VALUE as printable ASCII of at most MAX
# bytes (for values kept in the state file).
clean() {
	CLEAN=$(printf '%s' "$1" | LC_ALL=C awk -v max="$2" '
		{ s = s (NR > 1 ? " " : "") $0 }
		END { gsub(/[\t\r]/, " ", s); gsub(/[^ -~]/, "", s); printf "%s", substr(s, 1, max) }')
}

# AWK_MEMBERS reads a JSON answer and prints "key<TAB>value" for scalar
# members of the top-level object and of its objects ("config.version"),
# in any order and layout, strings decoded; the raw config.data goes to the
# file datafile, the commands to files in cmddir (see commands below).
AWK_MEMBERS='
function trim(s) { sub(/^[ \t\r\n]+/, "", s); sub(/[ \t\r\n]+$/, "", s); return s }
function hexv(h,    i, v, c) {
	v = 0; h = tolower(h)
	for (i = 1; i <= 4; i++) { c = index("0123456789abcdef", substr(h, i, 1)); if (!c) return -1; v = v * 16 + c - 1 }
	return v
}
function utf8(cp) {
	if (cp < 128) return sprintf("%c", cp)
	if (cp < 2048) return sprintf("%c%c", 192 + int(cp / 64), 128 + cp % 64)
	if (cp < 65536) return sprintf("%c%c%c", 224 + int(cp / 4096), 128 + int(cp / 64) % 64, 128 + cp % 64)
	return sprintf("%c%c%c%c", 240 + int(cp / 262144), 128 + int(cp / 4096) % 64, 128 + int(cp / 64) % 64, 128 + cp % 64)
}
# jdec decodes a JSON string (other values are returned as they are);
# control characters become spaces and set JBAD.
function jdec(v,    o, i, c, n, cp, lo) {
	if (v !~ /^".*"$/) return v
	v = substr(v, 2, length(v) - 2); o = ""; n = length(v)
	for (i = 1; i <= n; i++) {
		c = substr(v, i, 1)
		if (c != "\\") { o = o c; continue }
		c = substr(v, ++i, 1)
		if (c == "u") {
			cp = hexv(substr(v, i + 1, 4)); i += 4
			if (cp >= 55296 && cp < 56320 && substr(v, i + 1, 2) == "\\u") {
				lo = hexv(substr(v, i + 3, 4))
				if (lo >= 56320 && lo < 57344) { cp = 65536 + (cp - 55296) * 1024 + lo - 56320; i += 6 }
			}
			if (cp < 32 || cp == 127 || (cp >= 128 && cp < 160)) { JBAD = 1; o = o " " }
			else if (cp >= 55296 && cp < 57344) { JBAD = 1; o = o "?" }
			else o = o utf8(cp)
		} else if (c ~ /[bfnrt]/) { JBAD = 1; o = o " " }
		else o = o c
	}
	return o
}
function unq(v) { return jdec(v) }
# elems splits a JSON array into its elements.
function elems(s, E,    n, i, c, len, depth, instr, esc, st, v) {
	n = 0; depth = 0; instr = 0; esc = 0; len = length(s)
	for (i = 1; i <= len; i++) {
		c = substr(s, i, 1)
		if (instr) { if (esc) esc = 0; else if (c == "\\") esc = 1; else if (c == "\"") instr = 0; continue }
		if (c == "\"") instr = 1
		else if (c == "{" || c == "[") { depth++; if (depth == 1) st = i + 1 }
		else if (c == "}" || c == "]") { if (depth == 1) { v = trim(substr(s, st, i - st)); if (v != "" || n > 0) E[++n] = v } depth-- }
		else if (c == "," && depth == 1) { E[++n] = trim(substr(s, st, i - st)); st = i + 1 }
	}
	return n
}
# commands writes each command of the answer (at most 8) to cmddir/NN.meta
# (id, kind, timeout, why it is invalid or nothing: one per line) and
# cmddir/NN.args (its arguments, decoded, one per line), checked as
# protocol.Command.Validate does. Commands without a valid id are dropped:
# no result could name them.
function commands(v,    E, n, k, K2, V2, m, j, id, kind, to, args, A, D, na, bad, a, f, want) {
	n = elems(v, E)
	for (k = 1; k <= n && k <= 8; k++) {
		if (E[k] !~ /^\{/) continue
		split("", K2); split("", V2); split("", A); split("", D)
		id = ""; kind = ""; to = ""; args = ""; bad = ""; na = 0
		m = members(E[k], K2, V2)
		for (j = 1; j <= m; j++) {
			if (K2[j] == "id") id = V2[j]
			else if (K2[j] == "kind") { JBAD = 0; kind = jdec(V2[j]); if (JBAD || kind !~ /^[a-z-]+$/) kind = "?" }
			else if (K2[j] == "timeout") to = V2[j]
			else if (K2[j] == "args") args = V2[j]
		}
		if (id !~ /^[1-9][0-9]*$/ || length(id) > 19) continue
		if (args ~ /^\[/) na = elems(args, A)
		else if (args != "" && args != "null") bad = "args must be an array of strings"
		for (a = 1; a <= na; a++) {
			JBAD = 0
			if (A[a] !~ /^".*"$/) { bad = "args[" (a - 1) "] must be a string"; continue }
			D[a] = jdec(A[a])
			if (JBAD) bad = "args[" (a - 1) "] contains control characters"
			else if (length(D[a]) > 256) bad = "args[" (a - 1) "] is longer than 256 bytes"
		}
		if (to !~ /^[1-9][0-9]*$/ || length(to) > 4 || to + 0 > 3600) bad = "timeout must be within 1..3600 seconds"
		else if (na > 8) bad = "a command takes at most 8 arguments"
		want = (kind == "reboot") ? 0 : (kind == "ping" || kind == "read-log") ? 1 : (kind == "set-config") ? 2 : -1
		if (bad != "") ;
		else if (want >= 0 && na != want) bad = kind " takes " want " argument(s), not " na
		else if (kind == "ping" && D[1] !~ /^[A-Za-z0-9.:][A-Za-z0-9.:-]*$/) bad = "ping: the host must be a name or an address (letters, digits, \047.\047, \047:\047, \047-\047; not starting with \047-\047)"
		else if (kind == "read-log" && D[1] !~ /^[A-Za-z0-9_][A-Za-z0-9._-]*$/) bad = "read-log: the log name must be letters, digits, \047.\047, \047_\047, \047-\047, not starting with \047.\047 or \047-\047"
		else if (kind == "set-config" && D[1] !~ /^[A-Za-z0-9._][A-Za-z0-9._-]*$/) bad = "set-config: the key must be letters, digits, \047.\047, \047_\047, \047-\047, not starting with \047-\047"
		else if (kind != "reboot" && kind != "ping" && kind != "read-log" && kind != "set-config" && kind != "hook") bad = "kind must be one of [reboot ping read-log set-config hook]"
		f = cmddir "/" sprintf("%02d", k)
		printf "%s\n%s\n%s\n%s\n", id, kind, to, bad > (f ".meta")
		printf "" > (f ".args")
		for (a = 1; a <= na; a++) print D[a] > (f ".args")
		close(f ".meta"); close(f ".args")
	}
}
function members(s, K, V,    n, i, c, len, depth, instr, esc, expect, ks, vs) {
	n = 0; depth = 0; instr = 0; esc = 0; expect = 0 # 0: key, 1: colon, 2: value
	len = length(s)
	for (i = 1; i <= len; i++) {
		c = substr(s, i, 1)
		if (instr) {
			if (esc) esc = 0
			else if (c == "\\") esc = 1
			else if (c == "\"") {
				instr = 0
				if (depth == 1 && expect == 0) { K[n + 1] = substr(s, ks, i - ks); expect = 1 }
			}
			continue
		}
		if (c == "\"") { instr = 1; if (depth == 1 && expect == 0) ks = i + 1 }
		else if (c == "{" || c == "[") depth++
		else if (c == "}" || c == "]") {
			if (depth == 1 && expect == 2) { n++; V[n] = trim(substr(s, vs, i - vs)); expect = 0 }
			depth--
		} else if (depth == 1 && c == ":" && expect == 1) { expect = 2; vs = i + 1 }
		else if (depth == 1 && c == "," && expect == 2) { n++; V[n] = trim(substr(s, vs, i - vs)); expect = 0 }
	}
	return n
}
{ buf = buf $0 "\n" }
END {
	n = members(buf, K, V)
	for (i = 1; i <= n; i++) {
		if (V[i] ~ /^\{/) {
			split("", K2); split("", V2)
			m = members(V[i], K2, V2)
			for (j = 1; j <= m; j++) {
				if (K[i] == "config" && K2[j] == "data") { if (datafile != "") print V2[j] > datafile }
				else if (V2[j] !~ /^[[{]/) print K[i] "." K2[j] "\t" unq(V2[j])
			}
		} else if (K[i] == "commands" && V[i] ~ /^\[/) { if (cmddir != "") commands(V[i]) }
		else if (V[i] !~ /^\[/) print K[i] "\t" unq(V[i])
	}
}'

# --- state -----------------------------------------------------------------

DEVICE_ID=
TOKEN=
TOKEN_SERVER=
DEVICE_KEY=  # proves this device when it registers again (docs/protocol.md#admission)
OLD_TOKEN=   # the token last refused, sent as bearer when registering again
SEQ=0
CONFIG_VERSION=0
CONFIG_ERROR=
FAILED_VERSION=0
FAILED_AT=0
DONE_COMMANDS= # IDs of the last 64 commands received, never run twice
# fw_clear forgets the firmware update under way (docs/firmware.md): the
# offer, and the state downloading, ready (file checked), installing or
# failed.
fw_clear() {
	FW_ROLLOUT=
	FW_VERSION=
	FW_URL=
	FW_SHA256=
	FW_SIZE=
	FW_SIG=
	FW_STATE=
	FW_REASON=
	FW_HOOKED=0
}
fw_clear

# The state file holds KEY=value lines; values never contain newlines. It
# is read, not sourced.
save_state() {
	_t=$STATE_DIR/.state.tmp
	{
		printf 'DEVICE_ID=%s\nTOKEN=%s\nTOKEN_SERVER=%s\nSEQ=%s\nCONFIG_VERSION=%s\nCONFIG_ERROR=%s\nFAILED_VERSION=%s\nFAILED_AT=%s\nDEVICE_KEY=%s\n' \
			"$DEVICE_ID" "$TOKEN" "$SERVER" "$SEQ_RESERVED" "$CONFIG_VERSION" "$CONFIG_ERROR" "$FAILED_VERSION" "$FAILED_AT" "$DEVICE_KEY"
		printf 'DONE_COMMANDS=%s\nFW_ROLLOUT=%s\nFW_VERSION=%s\nFW_URL=%s\nFW_SHA256=%s\nFW_SIZE=%s\nFW_SIG=%s\nFW_STATE=%s\nFW_REASON=%s\nFW_HOOKED=%s\n' \
			"$DONE_COMMANDS" "$FW_ROLLOUT" "$FW_VERSION" "$FW_URL" "$FW_SHA256" "$FW_SIZE" "$FW_SIG" "$FW_STATE" "$FW_REASON" "$FW_HOOKED"
	} >"$_t" &&
		mv -f "$_t" "$STATE_DIR/state" && sync
	[ $? -eq 0 ] || log error "saving $STATE_DIR/state failed"
}

if [ -f "$STATE_DIR/state" ]; then
	while IFS= read -r _line || [ -n "$_line" ]; do
		_v=${_line#*=}
		case $_line in
		DEVICE_ID=*) DEVICE_ID=$_v ;;
		TOKEN=*) TOKEN=$_v ;;
		TOKEN_SERVER=*) TOKEN_SERVER=$_v ;;
		SEQ=*) SEQ=$_v ;;
		CONFIG_VERSION=*) CONFIG_VERSION=$_v ;;
		CONFIG_ERROR=*) CONFIG_ERROR=$_v ;;
		FAILED_VERSION=*) FAILED_VERSION=$_v ;;
		FAILED_AT=*) FAILED_AT=$_v ;;
		DEVICE_KEY=*) DEVICE_KEY=$_v ;;
		DONE_COMMANDS=*) DONE_COMMANDS=$_v ;;
		FW_ROLLOUT=*) FW_ROLLOUT=$_v ;;
		FW_VERSION=*) FW_VERSION=$_v ;;
		FW_URL=*) FW_URL=$_v ;;
		FW_SHA256=*) FW_SHA256=$_v ;;
		FW_SIZE=*) FW_SIZE=$_v ;;
		FW_SIG=*) FW_SIG=$_v ;;
		FW_STATE=*) FW_STATE=$_v ;;
		FW_REASON=*) FW_REASON=$_v ;;
		FW_HOOKED=*) FW_HOOKED=$_v ;;
		esac
	done <"$STATE_DIR/state"
fi
case $SEQ:$CONFIG_VERSION:$FAILED_VERSION:$FAILED_AT in
*[!0-9:]* | *::* | :* | *:) die "$STATE_DIR/state is corrupt; remove it to register again" ;;
esac
if [ -n "$FW_ROLLOUT" ]; then
	case $FW_ROLLOUT:$FW_SIZE:$FW_SHA256:$FW_HOOKED in
	*[!0-9a-f:]* | *::* | *:)
		log warn "the firmware update in $STATE_DIR/state is corrupt; dropped"
		FW_ROLLOUT=
		;;
	esac
fi
SEQ_RESERVED=$SEQ

MACHINE_ID=
[ -f "$STATE_DIR/machine-id" ] && read -r MACHINE_ID <"$STATE_DIR/machine-id"
NEW_MACHINE_ID=0
if [ -n "$MACHINE_ID_ARG" ] && [ "$MACHINE_ID_ARG" != "$MACHINE_ID" ]; then
	MACHINE_ID=$MACHINE_ID_ARG
	NEW_MACHINE_ID=1
elif [ -z "$MACHINE_ID" ]; then
	# A kept machine ID is never derived again (an upgraded agent keeps its own).
	derive_machine_id || die "no machine ID: fix --identity-script or set --machine-id"
	log info "machine ID derived: machine_id=$MACHINE_ID source=$MID_SOURCE"
	NEW_MACHINE_ID=1
fi
if [ "$NEW_MACHINE_ID" = 1 ]; then
	if ! { printf '%s\n' "$MACHINE_ID" >"$STATE_DIR/.machine-id.tmp" && mv -f "$STATE_DIR/.machine-id.tmp" "$STATE_DIR/machine-id"; }; then
		die "cannot write $STATE_DIR/machine-id"
	fi
	DEVICE_ID=
	TOKEN=
	DEVICE_KEY=
fi
if [ -n "$TOKEN$DEVICE_KEY" ] && [ "$TOKEN_SERVER" != "$SERVER" ]; then
	log info "server changed; registering again"
	DEVICE_ID=
	TOKEN=
	DEVICE_KEY=
fi

# --- identity and values that do not change --------------------------------

relvar() { # relvar FILE VAR: VAR of a shell-style release file
	[ -r "$1" ] || return 0
	(
		# shellcheck disable=SC1090
		. "$1" >/dev/null 2>&1
		eval "printf '%s' \"\${$2:-}\""
	)
}

firstline() {
	FIRSTLINE=
	[ -r "$1" ] || return 0
	FIRSTLINE=$(LC_ALL=C awk 'NR == 1 { gsub(/\000/, ""); sub(/^[ \t]+/, ""); sub(/[ \t\r]+$/, ""); print; exit }' "$1" 2>/dev/null)
}

# system_firmware sets _fw to the system's firmware and _dt to its device
# type (read again after a firmware install).
system_firmware() {
	if [ -r "$ROOT/etc/openwrt_release" ]; then
		_dt=openwrt
		_fw=$(relvar "$ROOT/etc/openwrt_release" DISTRIB_DESCRIPTION)
		[ -n "$_fw" ] || _fw=$(relvar "$ROOT/etc/openwrt_release" DISTRIB_RELEASE)
	else
		_dt=$(relvar "$ROOT/etc/os-release" ID)
		_fw=$(relvar "$ROOT/etc/os-release" PRETTY_NAME)
		[ -n "$_dt" ] || _dt=linux
	fi
	[ -n "$_fw" ] || _fw=$KERNEL
	[ -n "$_fw" ] || _fw=unknown
}
firstline "$ROOT/proc/sys/kernel/osrelease"
KERNEL=$FIRSTLINE
system_firmware
FIRMWARE_ARG=$FIRMWARE
[ -n "$DEVICE_TYPE" ] || DEVICE_TYPE=$_dt
[ -n "$FIRMWARE" ] || FIRMWARE=$_fw
for _f in tmp/sysinfo/model proc/device-tree/model sys/class/dmi/id/product_name; do
	[ -n "$MODEL" ] || {
		firstline "$ROOT/$_f"
		MODEL=$FIRSTLINE
	}
done
for _f in proc/device-tree/serial-number sys/class/dmi/id/product_serial; do
	[ -n "$SERIAL" ] || {
		firstline "$ROOT/$_f"
		SERIAL=$FIRSTLINE
	}
done

js "$FIRMWARE" 64
FIRMWARE_JSON=$JS
js "drover-agent.sh $AGENT_VERSION" 256
EXTRA_STATIC="\"agent\":$JS"
js "$(uname -m)" 256
EXTRA_STATIC="$EXTRA_STATIC,\"arch\":$JS"
EXTRA_N=2
if [ -n "$KERNEL" ]; then
	js "$KERNEL" 256
	EXTRA_STATIC="$EXTRA_STATIC,\"kernel\":$JS"
	EXTRA_N=$((EXTRA_N + 1))
fi
firstline "$ROOT/proc/sys/kernel/hostname"
if [ -n "$FIRSTLINE" ]; then
	js "$FIRSTLINE" 256
	EXTRA_STATIC="$EXTRA_STATIC,\"hostname\":$JS"
	EXTRA_N=$((EXTRA_N + 1))
fi

# IFACE_RE is --interfaces as an awk regular expression (globs: * ? [..]).
IFACE_RE=
if [ -n "$INTERFACES" ]; then
	IFACE_RE="^($(printf '%s' "$INTERFACES" | sed 's/[[:space:]]//g; s/[.+^$(){}|\\]/\\&/g; s/\*/.*/g; s/?/./g; s/,/|/g'))\$"
fi

# --- state collection ------------------------------------------------------

# AWK_STATE reads the /proc files and thermal zones named on its command line
# and prints the state members on line 1 and the CPU counters on line 2.
AWK_STATE='
function r1(x) { return x < 0 ? -int(-x * 10 + 0.5) / 10 : int(x * 10 + 0.5) / 10 }
FILENAME ~ /\/proc\/uptime$/ && FNR == 1 && $1 ~ /^[0-9.]+$/ { up = int($1); hup = 1 }
FILENAME ~ /\/proc\/loadavg$/ && FNR == 1 && $1 ~ /^[0-9]+\.[0-9]+$/ { l1 = $1; hl = 1 }
FILENAME ~ /\/proc\/meminfo$/ { k = $1; sub(/:$/, "", k); mem[k] = $2 + 0; if (k == "MemAvailable") ha = 1 }
FILENAME ~ /\/proc\/stat$/ && $1 == "cpu" { t = 0; for (i = 2; i <= 9 && i <= NF; i++) t += $i; ct = t; ci = $5 + $6; hc = 1 }
FILENAME ~ /\/temp$/ && FNR == 1 && $1 ~ /^-?[0-9]+$/ {
	c = $1 + 0; if (c > 1000 || c < -1000) c = c / 1000
	if (c >= -60 && c <= 250 && (!ht || c > tmax)) { tmax = c; ht = 1 }
}
FILENAME ~ /\/proc\/net\/dev$/ {
	i = index($0, ":"); if (!i) next
	name = substr($0, 1, i - 1); gsub(/[ \t]/, "", name)
	if (name !~ /^[A-Za-z0-9._@-]+$/ || length(name) > 64 || nif >= 64) next
	if (ifre == "" ? name == "lo" : name !~ ifre) next
	split(substr($0, i + 1), f, " ")
	ifs = ifs (nif++ ? "," : "") sprintf("{\"name\":\"%s\",\"rx_bytes\":%.0f,\"tx_bytes\":%.0f,\"rx_packets\":%.0f,\"tx_packets\":%.0f}", name, f[1], f[9], f[2], f[10])
}
END {
	s = ""
	if (hup) s = s ",\"uptime\":" up
	if (hl) s = s ",\"load1\":" l1
	if (hc && prev != "") {
		split(prev, p, " "); dt = ct - p[1]; di = ci - p[2]
		if (dt > 0 && di >= 0 && di <= dt) s = s ",\"cpu\":" r1((dt - di) * 100 / dt)
	}
	if ("MemTotal" in mem) {
		a = ha ? mem["MemAvailable"] : mem["MemFree"] + mem["Buffers"] + mem["Cached"]
		u = mem["MemTotal"] - a; if (u < 0) u = 0
		s = s sprintf(",\"mem_total\":%.0f,\"mem_used\":%.0f", mem["MemTotal"] * 1024, u * 1024)
	}
	if (ht) s = s ",\"temperature\":" r1(tmax)
	print substr(s ",\"interfaces\":[" ifs "]", 2)
	if (hc) printf "%.0f %.0f\n", ct, ci
}'

CPU_PREV=

# proc_state sets PROC_STATE to the members read from /proc and /sys, and
# CPU_PREV to the CPU counters for the next call.
proc_state() {
	set --
	for _f in "$ROOT/proc/uptime" "$ROOT/proc/loadavg" "$ROOT/proc/meminfo" "$ROOT/proc/stat" "$ROOT/proc/net/dev" \
		"$ROOT"/sys/class/thermal/thermal_zone*/temp; do
		[ -r "$_f" ] && set -- "$@" "$_f"
	done
	_out=$(LC_ALL=C awk -v prev="$CPU_PREV" -v ifre="$IFACE_RE" "$AWK_STATE" "$@" </dev/null)
	case $_out in
	*"$NL"*)
		PROC_STATE=${_out%%"$NL"*}
		CPU_PREV=${_out#*"$NL"}
		;;
	*) PROC_STATE=$_out ;;
	esac
}

# disk_state sets DISK_STATE to the disk members from df.
disk_state() {
	DISK_STATE=
	_df=$(df -Pk "$ROOT$DISK_PATH" 2>/dev/null) || return 0
	set -f
	# shellcheck disable=SC2086
	set -- $_df
	set +f
	[ $# -ge 13 ] || return 0
	shift 7 # the header: Filesystem 1024-blocks Used Available Capacity Mounted on
	case $2:$3 in *[!0-9:]* | :* | *:) return 0 ;; esac
	DISK_STATE=",\"disk_total\":$(($2 * 1024)),\"disk_used\":$(($3 * 1024))"
}

# AWK_COLLECTOR turns key=value lines into signal members (line 1) and extra
# members with leading commas (line 2); problems go to stderr.
AWK_COLLECTOR="$AWK_JSTR"'
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
function unq(s, q) {
	q = substr(s, 1, 1)
	if (length(s) >= 2 && (q == "\"" || q == "\047") && substr(s, length(s), 1) == q) return substr(s, 2, length(s) - 2)
	return s
}
/^[ \t]*(#|$)/ { next }
{
	i = index($0, "=")
	if (!i) { print "collector line is not key=value: " substr($0, 1, 40) > "/dev/stderr"; next }
	k = trim(substr($0, 1, i - 1)); v = unq(trim(substr($0, i + 1)))
	if (k == "rssi" || k == "rsrp" || k == "rsrq" || k == "sinr") {
		lo = (k == "rssi" || k == "rsrp") ? -200 : -100; hi = (k == "rssi" || k == "rsrp") ? 0 : 100
		if (v !~ /^-?[0-9]+(\.[0-9]+)?$/ || v + 0 < lo || v + 0 > hi) { print "collector: " k "=" v " ignored" > "/dev/stderr"; next }
		sig = sig ",\"" k "\":" (v + 0)
	} else if (k == "operator" || k == "technology") {
		sig = sig ",\"" k "\":" jstr(v, 64)
	} else if (k != "" && k !~ /^(agent|arch|kernel|hostname|collector_error)$/ && n < max) {
		ext = ext "," jstr(k, 64) ":" jstr(v, 256); n++
	}
}
END { print substr(sig, 2); print ext }'

# collect_extra runs the collector and sets COL_SIG (signal members) and
# COL_EXT (extra members, each with a leading comma).
COL_SIG=
COL_EXT=
collect_extra() {
	COL_SIG=
	COL_EXT=
	[ -n "$COLLECTOR" ] || return 0
	run_limited "$COLLECTOR_TIMEOUT" sh -c "$COLLECTOR" >"$RUN/collector.out" 2>"$RUN/collector.err"
	_rc=$?
	_max=$((64 - EXTRA_N))
	if [ $_rc -ne 0 ]; then
		_msg=$(sed -n '/[^[:space:]]/h; ${x;p;}' "$RUN/collector.err")
		[ -n "$_msg" ] || _msg="collector exited with status $_rc"
		log warn "collector failed: $_msg"
		js "$_msg" 256
		COL_EXT=",\"collector_error\":$JS"
		_max=$((_max - 1))
	fi
	_out=$(LC_ALL=C awk -v max="$_max" "$AWK_COLLECTOR" "$RUN/collector.out" 2>"$RUN/collector.warn")
	[ ! -s "$RUN/collector.warn" ] || log warn "$(tr '\n' ';' <"$RUN/collector.warn")"
	case $_out in
	*"$NL"*)
		COL_SIG=${_out%%"$NL"*}
		COL_EXT=$COL_EXT${_out#*"$NL"}
		;;
	*) COL_SIG=$_out ;;
	esac
}

# collect sets STATE to the state object.
collect() {
	proc_state
	disk_state
	collect_extra
	STATE="{$PROC_STATE$DISK_STATE,\"firmware\":$FIRMWARE_JSON"
	[ -z "$COL_SIG" ] || STATE="$STATE,\"signal\":{$COL_SIG}"
	STATE="$STATE,\"extra\":{$EXTRA_STATIC$COL_EXT}}"
}

# --- protocol --------------------------------------------------------------

STATUS=
RETRY_AFTER=
ERR_MSG=
ANS_INTERVAL=
ANS_VERSION=
ANS_DEVICE_ID=
ANS_TOKEN=
ANS_KEY=

# parse_answer reads $RUN/resp into the ANS_ variables and $RUN/data.
parse_answer() {
	ANS_INTERVAL=
	ANS_VERSION=
	ANS_DEVICE_ID=
	ANS_TOKEN=
	ANS_KEY=
	ANS_CODE=
	ANS_MSG=
	ANS_FW_ROLLOUT=
	ANS_FW_VERSION=
	ANS_FW_URL=
	ANS_FW_SHA256=
	ANS_FW_SIZE=
	ANS_FW_SIG=
	rm -f "$RUN/data" "$RUN"/cmds/*
	mkdir -p "$RUN/cmds"
	LC_ALL=C awk -v datafile="$RUN/data" -v cmddir="$RUN/cmds" "$AWK_MEMBERS" "$RUN/resp" >"$RUN/fields" 2>/dev/null || return 0
	while IFS="$TAB" read -r _k _v; do
		case $_k in
		firmware_update.rollout) ANS_FW_ROLLOUT=$_v ;;
		firmware_update.version) ANS_FW_VERSION=$_v ;;
		firmware_update.url) ANS_FW_URL=$_v ;;
		firmware_update.sha256) ANS_FW_SHA256=$(printf '%s' "$_v" | tr 'A-F' 'a-f') ;;
		firmware_update.size) ANS_FW_SIZE=$_v ;;
		firmware_update.signature) ANS_FW_SIG=$_v ;;
		push_interval) ANS_INTERVAL=$_v ;;
		config.version) ANS_VERSION=$_v ;;
		device_id) ANS_DEVICE_ID=$_v ;;
		token) ANS_TOKEN=$_v ;;
		device_key) ANS_KEY=$_v ;;
		error.code) ANS_CODE=$_v ;;
		error.message) ANS_MSG=$_v ;;
		esac
	done <"$RUN/fields"
}

# post PATH BODYFILE [auth]: sets STATUS (000 on network errors),
# RETRY_AFTER, ERR_MSG and, through parse_answer, the ANS_ variables.
post() {
	set -- "$1" "$2" "${3:-}"
	: >"$RUN/hdr"
	: >"$RUN/resp"
	set -- "$@" -sS -o "$RUN/resp" -D "$RUN/hdr" -w '%{http_code}\n' --max-time "$TIMEOUT" --connect-timeout "$TIMEOUT" \
		-H 'Content-Type: application/json' -A "drover-agent.sh/$AGENT_VERSION" --data-binary "@$2"
	[ -z "$CA_CERT" ] || set -- "$@" --cacert "$CA_CERT"
	if [ -n "$PIN" ]; then
		set -- "$@" --pinnedpubkey "$PIN"
		[ -n "$CA_CERT" ] || set -- "$@" -k # the pin alone decides, as in the Go agent
	fi
	if [ "$3" = auth ] || { [ "$3" = oldauth ] && [ -n "$OLD_TOKEN" ]; }; then
		[ "$3" = auth ] && _tok=$TOKEN || _tok=$OLD_TOKEN
		printf 'Authorization: Bearer %s\n' "$_tok" >"$RUN/auth"
		set -- "$@" -H "@$RUN/auth" # from a file: the token stays out of ps
	fi
	_url=$SERVER$1
	shift 3
	bg_wait curl "$@" "$_url" >"$RUN/code" 2>"$RUN/curl.err"
	_rc=$?
	STATUS=
	read -r STATUS <"$RUN/code"
	RETRY_AFTER=
	while IFS= read -r _h; do
		case $_h in [Rr][Ee][Tt][Rr][Yy]-[Aa][Ff][Tt][Ee][Rr]:*)
			_h=${_h#*:}
			_h=${_h%"$(printf '\r')"}
			_h=${_h# }
			case $_h in '' | *[!0-9]*) ;; *) RETRY_AFTER=$_h ;; esac
			;;
		esac
	done <"$RUN/hdr"
	ERR_MSG=
	if [ $_rc -ne 0 ] || [ -z "$STATUS" ] || [ "$STATUS" = 000 ]; then
		STATUS=000
		ERR_MSG="curl exit $_rc: $(tr '\n' ' ' <"$RUN/curl.err")"
		return
	fi
	parse_answer
	[ "$STATUS" = 200 ] || ERR_MSG="server answered $STATUS $ANS_CODE: $ANS_MSG"
}

# retry_delay sets RETRY_DELAY, the wait after a failed exchange: the
# server's Retry-After spread by up to half, or exponential backoff with
# jitter (never below half its nominal value, never 0).
BO_N=0
RETRY_DELAY=0
retry_delay() {
	if [ -n "$RETRY_AFTER" ] && [ "$RETRY_AFTER" -gt 0 ]; then
		[ "$RETRY_AFTER" -le 3600 ] || RETRY_AFTER=3600
		_sp=$((RETRY_AFTER / 2))
		[ $_sp -ge 1 ] || _sp=1
		RETRY_DELAY=$((RETRY_AFTER + $(rand $_sp)))
		return
	fi
	_d=$MIN_BACKOFF
	_i=0
	while [ $_i -lt $BO_N ] && [ "$_d" -lt "$MAX_BACKOFF" ]; do
		_d=$((_d * 2))
		_i=$((_i + 1))
	done
	if [ "$_d" -lt "$MAX_BACKOFF" ]; then
		BO_N=$((BO_N + 1))
	else
		_d=$MAX_BACKOFF
	fi
	RETRY_DELAY=$((_d / 2 + $(rand $((_d - _d / 2)))))
	[ "$RETRY_DELAY" -ge 1 ] || RETRY_DELAY=1
}

INTERVAL=60

set_interval() {
	case $1 in '' | *[!0-9]*) return ;; esac
	[ "$1" -ge 1 ] || return
	[ "$1" -le 604800 ] && INTERVAL=$1 || INTERVAL=604800
}

# register obtains a token, proving the device with its device key and its
# last token. Returns 0 when registered, 1 to retry after RETRY_DELAY (also
# while an operator has to approve: 202), 2 to retry after --enroll-retry.
register() {
	if [ -z "$SECRET" ] && [ -z "$DEVICE_KEY" ] && [ -z "$ENROLL_TOKEN" ]; then
		log error "not registered and no --enroll-secret given"
		return 2
	fi
	js "$MACHINE_ID" 128
	_b="{\"machine_id\":$JS"
	js "$DEVICE_TYPE" 64
	_b="$_b,\"device_type\":$JS"
	js "$MODEL" 64
	_b="$_b,\"model\":$JS"
	js "$SERIAL" 128
	_b="$_b,\"serial\":$JS"
	if [ -n "$DEVICE_KEY" ]; then
		js "$DEVICE_KEY" 256
		_b="$_b,\"device_key\":$JS"
	fi
	if [ -n "$SECRET" ]; then
		js "$SECRET" 256
		_b="$_b,\"enrollment_secret\":$JS"
	fi
	if [ -n "$ENROLL_TOKEN" ] && [ -z "$DEVICE_KEY" ]; then # single use: only until the device has a key
		js "$ENROLL_TOKEN" 256
		_b="$_b,\"enrollment_token\":$JS"
	fi
	printf '%s,"firmware":%s}' "$_b" "$FIRMWARE_JSON" >"$RUN/body"
	post /api/v1/register "$RUN/body" oldauth
	case $ANS_KEY in
	'' | *[!A-Za-z0-9._~+/=:-]*) ;;
	*)
		DEVICE_KEY=$ANS_KEY # kept also while pending: it claims the request
		DEVICE_ID=$ANS_DEVICE_ID
		save_state
		;;
	esac
	case $STATUS in
	200) ;;
	202)
		[ -n "$RETRY_AFTER" ] && [ "$RETRY_AFTER" -ge 60 ] || RETRY_AFTER=60
		log warn "registration waits for an operator's approval (202)"
		return 1
		;;
	403 | 409)
		case $STATUS:$ANS_CODE in
		403:device_* | 403:not_preauthorized | 403:certificate_required | 403:invalid_enrollment_token | 409:*)
			log error "registration refused: $ERR_MSG"
			;;
		*) log error "the server rejected the enrollment secret (403): check --enroll-secret against the server's secrets.json" ;;
		esac
		return 2
		;;
	*)
		log warn "registration failed: $ERR_MSG"
		return 1
		;;
	esac
	case $ANS_DEVICE_ID:$ANS_TOKEN in
	*[!A-Za-z0-9._~+/=:-]* | :* | *:)
		log warn "registration answer lacks a valid device_id or token"
		return 1
		;;
	esac
	[ -z "$DEVICE_ID" ] || [ "$DEVICE_ID" = "$ANS_DEVICE_ID" ] || log warn "server assigned a different device ID: was $DEVICE_ID, now $ANS_DEVICE_ID"
	DEVICE_ID=$ANS_DEVICE_ID
	TOKEN=$ANS_TOKEN
	OLD_TOKEN=
	set_interval "$ANS_INTERVAL"
	save_state
	log info "registered: device_id=$DEVICE_ID push_interval=$INTERVAL"
	return 0
}

# apply_config VERSION: hands $RUN/data to the hook unless this version
# failed recently. Returns 0 when the hook ran.
apply_config() {
	_ver=$1
	# Compared for equality (docs/protocol.md): a layered configuration's
	# next version may be a lower number.
	if [ "$_ver" = "$CONFIG_VERSION" ]; then
		log warn "server sent configuration version $_ver, already applied"
		return 1
	fi
	if [ "$_ver" = "$FAILED_VERSION" ]; then
		[ "$REPORTING" = 0 ] && [ "$HOOK_RETRY" -gt 0 ] || return 1
		[ $(($(date +%s) - FAILED_AT)) -ge "$HOOK_RETRY" ] || return 1
	fi
	_pending=$STATE_DIR/config-pending.json
	if [ -z "$HOOK" ]; then
		_err="no configuration hook is installed on this device (drover-agent.sh --hook)"
	elif ! mv -f "$RUN/data" "$_pending"; then
		_err="agent could not write the configuration to $_pending"
	else
		log info "applying configuration version $_ver"
		export DROVER_CONFIG_VERSION="$_ver" DROVER_CONFIG_FILE="$_pending" \
			DROVER_APPLIED_CONFIG_FILE="$STATE_DIR/config.json" DROVER_APPLIED_VERSION="$CONFIG_VERSION"
		BG_IN=$_pending
		_t0=$(date +%s)
		run_limited "$HOOK_TIMEOUT" sh -c "$HOOK" >"$RUN/hook.out" 2>"$RUN/hook.err"
		_rc=$?
		BG_IN=/dev/null
		unset DROVER_CONFIG_VERSION DROVER_CONFIG_FILE DROVER_APPLIED_CONFIG_FILE DROVER_APPLIED_VERSION
		if [ $_rc -eq 0 ]; then
			_err=
			mv -f "$_pending" "$STATE_DIR/config.json"
		else
			_err=$(sed -n '/[^[:space:]]/h; ${x;p;}' "$RUN/hook.err")
			[ -n "$_err" ] || _err=$(sed -n '/[^[:space:]]/h; ${x;p;}' "$RUN/hook.out")
			case $_rc in 124 | 137 | 143) # GNU and busybox timeout
				[ $(($(date +%s) - _t0)) -lt "$HOOK_TIMEOUT" ] || _err="hook timed out after $HOOK_TIMEOUT s"
				;;
			esac
			[ -n "$_err" ] || _err="hook exited with status $_rc"
		fi
	fi
	if [ -z "$_err" ]; then
		log info "configuration version $_ver applied"
		CONFIG_VERSION=$_ver
		CONFIG_ERROR=
		FAILED_VERSION=0
		FAILED_AT=0
	else
		log error "configuration version $_ver not applied: $_err"
		clean "$_err" 1000
		CONFIG_ERROR=$CLEAN
		FAILED_VERSION=$_ver
		FAILED_AT=$(date +%s)
	fi
	save_state
	return 0
}

# --- remote commands (docs/protocol.md#commands) ---------------------------

# AWK_OUTPUT turns a command's output (its last 8 KiB) into the result's
# lines as JSON strings: printable ASCII, tabs as spaces, at most 256 lines.
AWK_OUTPUT="$AWK_JSTR"'
{ L[++n] = $0 }
END {
	while (n > 0 && L[n] ~ /^\r?$/) n--
	s = n > 256 ? n - 255 : 1
	for (i = s; i <= n; i++) printf "%s%s", (i > s ? "," : ""), jstr(L[i], 8192)
}'

RESULTS=$STATE_DIR/results # one JSON object per command ID, until pushed
REBOOT_AFTER_PUSH=0

# cmd_result ID STARTED CODE ERROR: queues the result of a command with the
# output in $RUN/cmd.out.
cmd_result() {
	_out=$(tail -c 8192 "$RUN/cmd.out" 2>/dev/null | LC_ALL=C awk "$AWK_OUTPUT")
	_r="{\"id\":$1,\"exit_code\":$3"
	if [ -n "$4" ]; then
		js "$4" 1024
		_r="$_r,\"error\":$JS"
	fi
	[ -z "$_out" ] || _r="$_r,\"output\":[$_out]"
	mkdir -p "$RESULTS" &&
		printf '%s,"started_at":%s,"finished_at":%s}\n' "$_r" "$2" "$(date +%s)" >"$RESULTS/.$1.tmp" &&
		mv -f "$RESULTS/.$1.tmp" "$RESULTS/$1" || log error "cannot queue the result of command $1 in $RESULTS"
	log info "command ran: id=$1 exit_code=$3${4:+ error=$4}"
}

# cmd_exec TIMEOUT ARGV...: runs ARGV (no shell) into $RUN/cmd.out; sets
# CMD_CODE and CMD_ERR.
cmd_exec() {
	_to=$1
	shift
	_t0=$(date +%s)
	run_limited "$_to" "$@" >"$RUN/cmd.out" 2>&1
	CMD_CODE=$?
	CMD_ERR=
	case $CMD_CODE in
	124 | 137 | 143)
		if [ $(($(date +%s) - _t0)) -ge "$_to" ]; then
			CMD_CODE=-1
			CMD_ERR="timed out after ${_to}s"
		fi
		;;
	126 | 127)
		CMD_CODE=-1
		CMD_ERR="cannot run $1"
		;;
	esac
}

# run_command NN: runs the command in $RUN/cmds/NN.{meta,args} once.
run_command() {
	_argf=$RUN/cmds/$1.args
	{
		read -r _cid
		read -r _kind
		read -r _cto
		read -r _bad
	} <"$RUN/cmds/$1.meta"
	case " $DONE_COMMANDS " in *" $_cid "*) return 1 ;; esac
	set -f
	# shellcheck disable=SC2086
	set -- $DONE_COMMANDS
	set +f
	[ $# -lt 64 ] || shift $(($# - 63))
	DONE_COMMANDS="$* $_cid"
	DONE_COMMANDS=${DONE_COMMANDS# }
	save_state # before running: a crash must not run it again
	_started=$(date +%s)
	: >"$RUN/cmd.out"
	if [ -n "$_bad" ]; then
		cmd_result "$_cid" "$_started" -1 "invalid command: $_bad"
		return 0
	fi
	case ,$COMMANDS, in
	*",$_kind,"*) ;;
	*)
		cmd_result "$_cid" "$_started" -1 "$_kind is not allowed on this device (drover-agent.sh --commands)"
		return 0
		;;
	esac
	set --
	while IFS= read -r _a; do set -- "$@" "$_a"; done <"$_argf"
	case $_kind in
	reboot)
		if [ -z "$REBOOT_COMMAND" ]; then
			cmd_result "$_cid" "$_started" -1 "no reboot command configured"
			return 0
		fi
		REBOOT_AFTER_PUSH=1 # after the result reached the server
		echo "rebooting after this result is sent" >"$RUN/cmd.out"
		cmd_result "$_cid" "$_started" 0 ""
		return 0
		;;
	ping) cmd_exec "$_cto" ping -c 3 "$1" ;;
	read-log)
		_path=
		_IFS=$IFS
		IFS=,
		set -f
		for _l in $LOGS; do
			case $_l in "$1="*) _path=${_l#*=} ;; esac
		done
		set +f
		IFS=$_IFS
		if [ -z "$_path" ]; then
			cmd_result "$_cid" "$_started" -1 "no log named $1 is configured on this device (drover-agent.sh --logs NAME=PATH)"
			return 0
		fi
		if ! tail -c 8192 "$_path" >"$RUN/cmd.out" 2>"$RUN/cmd.err"; then
			cmd_result "$_cid" "$_started" -1 "$(head -n 1 "$RUN/cmd.err")"
			return 0
		fi
		CMD_CODE=0
		CMD_ERR=
		;;
	set-config | hook)
		if [ -z "$COMMAND_HOOK" ]; then
			cmd_result "$_cid" "$_started" -1 "no command hook configured on this device (drover-agent.sh --command-hook)"
			return 0
		fi
		cmd_exec "$_cto" "$COMMAND_HOOK" "$_kind" "$@"
		;;
	esac
	cmd_result "$_cid" "$_started" "$CMD_CODE" "$CMD_ERR"
	return 0
}

# run_commands runs the commands of the last answer; CMDS_RAN=1 when any ran.
CMDS_RAN=0
run_commands() {
	CMDS_RAN=0
	for _f in "$RUN"/cmds/*.meta; do
		[ -f "$_f" ] || continue
		_n=${_f##*/}
		run_command "${_n%.meta}" && CMDS_RAN=1
	done
}

# pending_results sets RESULTS_JSON to the first 4 queued results and
# RESULTS_SENT to their IDs.
pending_results() {
	RESULTS_JSON=
	RESULTS_SENT=
	[ -d "$RESULTS" ] || return 0
	_k=0
	for _id in $(ls "$RESULTS" | sort -n); do
		case $_id in *[!0-9]*) continue ;; esac
		[ $_k -lt 4 ] || break
		_r=$(cat "$RESULTS/$_id") || continue
		_k=$((_k + 1))
		RESULTS_JSON="$RESULTS_JSON${RESULTS_JSON:+,}$_r"
		RESULTS_SENT="$RESULTS_SENT $_id"
	done
}

results_left() {
	for _f in "$RESULTS"/*; do
		case ${_f##*/} in '' | *[!0-9]*) ;; *) return 0 ;; esac
	done
	return 1
}

reboot_now() {
	REBOOT_AFTER_PUSH=0
	log warn "rebooting as an operator asked: $REBOOT_COMMAND"
	set -f
	# shellcheck disable=SC2086
	set -- $REBOOT_COMMAND
	set +f
	run_limited 60 "$@" >"$RUN/cmd.out" 2>&1 || log error "reboot command failed: $(tail -n 1 "$RUN/cmd.out")"
}

# --- firmware updates (docs/firmware.md) ----------------------------------

FW_DIR=$STATE_DIR/firmware

fw_part() { printf '%s/%s.part' "$FW_DIR" "$FW_SHA256"; }

# fsize FILE prints its size in bytes (0 when absent).
fsize() {
	_sz=$(wc -c <"$1" 2>/dev/null | tr -d ' ')
	echo "${_sz:-0}"
}

sha256_of() {
	if command -v sha256sum >/dev/null 2>&1; then
		sha256sum "$1" | cut -d ' ' -f 1
	else
		openssl dgst -sha256 -r "$1" | cut -d ' ' -f 1
	fi
}

# FW_KEY_PEM: --firmware-key as PEM (openssl reads it), checked at start.
FW_KEY_PEM=
if [ -n "$FW_KEY" ]; then
	command -v openssl >/dev/null 2>&1 || die "--firmware-key needs openssl (version 3, for ed25519 with -rawin)"
	[ -r "$FW_KEY" ] || die "--firmware-key $FW_KEY is not readable"
	FW_KEY_PEM=$RUN/firmware-key.pem
	if grep -q 'BEGIN PUBLIC KEY' "$FW_KEY"; then
		cp "$FW_KEY" "$FW_KEY_PEM"
	else
		# 32 raw bytes in base64: prefix the DER header of an ed25519 key.
		{
			printf '\060\052\060\005\006\003\053\145\160\003\041\000'
			tr -d ' \r\n\t' <"$FW_KEY" | openssl base64 -d -A
		} >"$RUN/firmware-key.der"
		[ "$(fsize "$RUN/firmware-key.der")" = 44 ] || die "--firmware-key $FW_KEY: neither a PEM public key nor 32 bytes in base64"
		openssl pkey -pubin -inform DER -in "$RUN/firmware-key.der" -out "$FW_KEY_PEM" 2>/dev/null || die "--firmware-key $FW_KEY: not an ed25519 key"
	fi
	openssl pkey -pubin -in "$FW_KEY_PEM" -noout -text 2>/dev/null | grep -q ED25519 || die "--firmware-key $FW_KEY: not an ed25519 public key"
fi

fw_fail() {
	FW_STATE=failed
	clean "$1" 1000
	FW_REASON=$CLEAN
	log error "firmware update failed: $FW_REASON"
}

# fw_check FILE: size, SHA-256 and, with a key, the signature. Prints the
# reason of a failure.
fw_check() {
	_n=$(fsize "$1")
	if [ "$_n" != "$FW_SIZE" ]; then
		echo "size $_n, offered $FW_SIZE"
		return 1
	fi
	_sum=$(sha256_of "$1")
	if [ "$_sum" != "$FW_SHA256" ]; then
		echo "sha256 mismatch: got $_sum"
		return 1
	fi
	[ -n "$FW_KEY_PEM" ] || return 0
	printf '%s' "$FW_SIG" | openssl base64 -d -A >"$1.sig" 2>/dev/null
	openssl dgst -sha256 -binary "$1" >"$1.sha256"
	if ! openssl pkeyutl -verify -pubin -inkey "$FW_KEY_PEM" -rawin -in "$1.sha256" -sigfile "$1.sig" >/dev/null 2>&1; then
		rm -f "$1.sig" "$1.sha256"
		echo "the ed25519 signature does not verify with --firmware-key"
		return 1
	fi
	rm -f "$1.sig" "$1.sha256"
}

# fw_fetch runs in the background: downloads the offered file into its
# .part file (curl -C -: Range from what is there), retrying until it is
# complete, then checks it and writes the outcome ("ready", or "failed"
# and the reason) to FW_DIR/result; wakes the agent with USR1.
fw_fetch() {
	_fc=
	trap '[ -z "$_fc" ] || kill "$_fc" 2>/dev/null; exit 1' TERM
	trap - INT HUP EXIT USR1
	_part=$(fw_part)
	_bo=$MIN_BACKOFF
	_cap=$MAX_BACKOFF
	[ "$_cap" -le 60 ] || _cap=60
	while [ "$(fsize "$_part")" -lt "$FW_SIZE" ]; do
		_have=$(fsize "$_part")
		set -- -sS --fail -o "$_part" -C - -A "drover-agent.sh/$AGENT_VERSION" --connect-timeout "$TIMEOUT" \
			--speed-limit 1 --speed-time "$TIMEOUT"
		[ -z "$CA_CERT" ] || set -- "$@" --cacert "$CA_CERT"
		case $FW_URL in
		/*)
			_url=$SERVER$FW_URL
			[ -z "$PIN" ] || set -- "$@" --pinnedpubkey "$PIN"
			[ -z "$PIN" ] || [ -n "$CA_CERT" ] || set -- "$@" -k
			_tok=$(sed -n 's/^TOKEN=//p' "$STATE_DIR/state")
			printf 'Authorization: Bearer %s\n' "$_tok" >"$RUN/fw-auth"
			set -- "$@" -H "@$RUN/fw-auth"
			[ "$_have" = 0 ] || set -- "$@" -H "If-Range: \"$FW_SHA256\""
			;;
		*) _url=$FW_URL ;;
		esac
		curl "$@" "$_url" </dev/null 2>"$RUN/fw-curl.err" &
		_fc=$!
		wait "$_fc"
		_rc=$?
		_fc=
		[ "$(fsize "$_part")" -le "$FW_SIZE" ] || break # the check says so
		[ $_rc -ne 0 ] || continue
		# 33: the server sent the whole file (If-Range no longer matches).
		[ $_rc -ne 33 ] || : >"$_part"
		log warn "firmware download interrupted (curl exit $_rc: $(tr '\n' ' ' <"$RUN/fw-curl.err")); resuming in $_bo s, have $(fsize "$_part") of $FW_SIZE bytes"
		sleep "$_bo" &
		_fc=$!
		wait "$_fc" # TERM ends it at once
		_fc=
		_bo=$((_bo * 2))
		[ "$_bo" -le "$_cap" ] || _bo=$_cap
	done
	if _why=$(fw_check "$_part"); then
		printf 'ready\n' >"$FW_DIR/.result"
	else
		rm -f "$_part"
		printf 'failed\n%s\n' "$_why" >"$FW_DIR/.result"
	fi
	mv -f "$FW_DIR/.result" "$FW_DIR/result"
	kill -USR1 "$MAIN_PID" 2>/dev/null
	exit 0
}

fw_running() { [ -n "$FW_PID" ] && kill -0 "$FW_PID" 2>/dev/null; }

fw_download() {
	fw_running && return 0
	mkdir -p "$FW_DIR" || {
		fw_fail "cannot create $FW_DIR"
		save_state
		return 0
	}
	rm -f "$FW_DIR/result"
	fw_fetch &
	FW_PID=$!
	log debug "firmware download started (pid $FW_PID)"
}

fw_cancel() {
	if fw_running; then
		kill "$FW_PID" 2>/dev/null
		wait "$FW_PID" 2>/dev/null
	fi
	FW_PID=
	rm -f "$FW_DIR/result"
}

# fw_collect takes the outcome of a finished download.
fw_collect() {
	[ "$FW_STATE" = downloading ] && [ -f "$FW_DIR/result" ] || return 0
	{
		read -r _st
		read -r _why
	} <"$FW_DIR/result"
	rm -f "$FW_DIR/result"
	FW_PID=
	if [ "$_st" = ready ]; then
		FW_STATE=ready
		log info "firmware downloaded and checked: rollout $FW_ROLLOUT version $FW_VERSION"
	else
		fw_fail "${_why:-download failed}"
	fi
	save_state
}

# fw_report sets FW_JSON to the push's firmware_update member.
fw_report() {
	FW_JSON=
	[ -n "$FW_ROLLOUT" ] || return 0
	_st=$FW_STATE
	_pr=0
	case $FW_STATE in
	ready)
		_st=downloading
		_pr=$FW_SIZE
		;;
	downloading) _pr=$(fsize "$(fw_part)") ;;
	esac
	FW_JSON=",\"firmware_update\":{\"rollout\":$FW_ROLLOUT,\"state\":\"$_st\",\"progress\":$_pr"
	if [ -n "$FW_REASON" ]; then
		js "$FW_REASON" 1024
		FW_JSON="$FW_JSON,\"reason\":$JS"
	fi
	FW_JSON="$FW_JSON}"
}

# fw_install hands the checked file to --firmware-hook. Returns 0 when the
# outcome should be pushed at once (failed, or installed without a reboot).
fw_install() {
	FW_HOOKED=1
	save_state
	_file=$(fw_part)
	log info "installing firmware $FW_VERSION with $FW_HOOK"
	export DROVER_FIRMWARE_FILE="$_file" DROVER_FIRMWARE_VERSION="$FW_VERSION" DROVER_FIRMWARE_SHA256="$FW_SHA256" DROVER_FIRMWARE_ROLLOUT="$FW_ROLLOUT"
	_t0=$(date +%s)
	run_limited "$FW_HOOK_TIMEOUT" sh -c "$FW_HOOK" >"$RUN/fwhook.out" 2>"$RUN/fwhook.err"
	_rc=$?
	unset DROVER_FIRMWARE_FILE DROVER_FIRMWARE_VERSION DROVER_FIRMWARE_SHA256 DROVER_FIRMWARE_ROLLOUT
	if [ $_rc -ne 0 ]; then
		_err=$(sed -n '/[^[:space:]]/h; ${x;p;}' "$RUN/fwhook.err")
		[ -n "$_err" ] || _err=$(sed -n '/[^[:space:]]/h; ${x;p;}' "$RUN/fwhook.out")
		case $_rc in 124 | 137 | 143)
			[ $(($(date +%s) - _t0)) -lt "$FW_HOOK_TIMEOUT" ] || _err="firmware hook timed out after $FW_HOOK_TIMEOUT s"
			;;
		esac
		[ -n "$_err" ] || _err="firmware hook exited with status $_rc"
		fw_fail "$_err"
		rm -f "$_file"
		save_state
		return 0
	fi
	if [ -z "$FIRMWARE_ARG" ]; then
		system_firmware
		set_firmware "$_fw"
	fi
	if [ "$FIRMWARE" = "$FW_VERSION" ]; then
		log info "firmware $FW_VERSION installed"
		rm -f "$_file"
		fw_clear
		save_state
		return 0
	fi
	log info "firmware hook done; waiting for the reboot into $FW_VERSION (running $FIRMWARE)"
	return 1
}

# fw_step acts on the answer's offer (ANS_FW_*). Returns 0 when the server
# should hear the outcome at once.
fw_step() {
	if [ -z "$ANS_FW_ROLLOUT" ]; then
		[ -n "$FW_ROLLOUT" ] || return 1
		if [ "$FW_STATE" = installing ]; then # the server stops offering once told
			[ "$FW_HOOKED" = 1 ] && return 1  # waiting for the reboot
			fw_install
			return
		fi
		log info "firmware offer withdrawn: rollout $FW_ROLLOUT, state $FW_STATE"
		fw_cancel
		rm -f "$(fw_part)"
		fw_clear
		save_state
		return 1
	fi
	if [ "$ANS_FW_ROLLOUT" != "$FW_ROLLOUT" ] || [ "$ANS_FW_SHA256" != "$FW_SHA256" ]; then
		fw_cancel
		[ -z "$FW_SHA256" ] || rm -f "$(fw_part)"
		fw_clear
		FW_ROLLOUT=$ANS_FW_ROLLOUT
		clean "$ANS_FW_VERSION" 64
		FW_VERSION=$CLEAN
		clean "$ANS_FW_URL" 2048
		FW_URL=$CLEAN
		FW_SHA256=$ANS_FW_SHA256
		FW_SIZE=$ANS_FW_SIZE
		clean "$ANS_FW_SIG" 256
		FW_SIG=$CLEAN
		FW_STATE=downloading
		case $FW_ROLLOUT in '' | *[!0-9]*) FW_ROLLOUT=0 ;; esac
		if [ -z "$FW_HOOK" ]; then
			fw_fail "no firmware hook installed on this device (drover-agent.sh --firmware-hook)"
		elif ! { [ ${#FW_SHA256} -eq 64 ] && [ -n "$FW_SIZE" ] && [ "$FW_SIZE" -gt 0 ] 2>/dev/null; } ||
			[ -n "$(printf '%s' "$FW_SHA256" | tr -d '0-9a-f')" ]; then
			FW_SIZE=0
			FW_SHA256=0000000000000000000000000000000000000000000000000000000000000000
			fw_fail "offer without size or sha256"
		elif [ -n "$FW_KEY_PEM" ] && [ -z "$FW_SIG" ]; then
			fw_fail "firmware is not signed and this device requires a signature"
		else
			case $FW_URL in
			/* | https://*) ;;
			http://*) [ "$ALLOW_HTTP" = 1 ] || fw_fail "firmware url $FW_URL is not https" ;;
			*) fw_fail "firmware url $FW_URL is not https" ;;
			esac
		fi
		log info "firmware offered: rollout $FW_ROLLOUT version $FW_VERSION size $FW_SIZE state $FW_STATE"
		save_state
		[ "$FW_STATE" = failed ] && return 0
		fw_download
		return 1
	fi
	fw_collect
	case $FW_STATE in
	downloading) fw_download ;; # resumes after a restart
	ready)
		FW_STATE=installing
		save_state
		return 0 # report installing before the hook runs
		;;
	installing)
		[ "$FW_HOOKED" = 1 ] || {
			fw_install
			return
		}
		;;
	esac
	return 1
}

# set_firmware sets the firmware the pushes report.
set_firmware() {
	FIRMWARE=$1
	js "$FIRMWARE" 64
	FIRMWARE_JSON=$JS
}

# fw_start settles an install left by the previous run: on the new
# firmware it is done, on the old one it failed.
fw_start() {
	[ "$FW_STATE" = installing ] && [ "$FW_HOOKED" = 1 ] || return 0
	if [ "$FIRMWARE" = "$FW_VERSION" ]; then
		log info "firmware update installed: $FW_VERSION"
		fw_clear
	else
		fw_fail "still runs $FIRMWARE after installing $FW_VERSION"
	fi
	save_state
}

# push: returns 0 on success (HOOK_RAN=1 when a configuration was handed
# to the hook), 1 on failure, 3 when the token was refused.
HOOK_RAN=0
MORE=0 # command results or a firmware outcome to push at once
REPORTING=0
STARTED=',"started":true' # until a push is accepted: the first after a start is not counted
push() {
	HOOK_RAN=0
	MORE=0
	export DROVER_DEVICE_ID="$DEVICE_ID" DROVER_MACHINE_ID="$MACHINE_ID" DROVER_STATE_DIR="$STATE_DIR" DROVER_SERVER="$SERVER"
	collect
	SEQ=$((SEQ + 1))
	if [ "$SEQ" -gt "$SEQ_RESERVED" ]; then
		SEQ_RESERVED=$((SEQ + 63))
		save_state
	fi
	_ce=
	if [ -n "$CONFIG_ERROR" ]; then
		js "$CONFIG_ERROR" 1024
		_ce=",\"config_error\":$JS"
	fi
	fw_collect
	fw_report
	pending_results
	_res=
	[ -z "$RESULTS_JSON" ] || _res=",\"results\":[$RESULTS_JSON]"
	_reboot=$REBOOT_AFTER_PUSH
	printf '{"seq":%s,"config_version":%s%s,"state":%s%s%s%s}' "$SEQ" "$CONFIG_VERSION" "$_ce" "$STATE" "$FW_JSON" "$_res" "$STARTED" >"$RUN/body"
	post /api/v1/push "$RUN/body" auth
	case $STATUS in
	200) STARTED= ;;
	401) return 3 ;;
	*)
		log warn "push failed: $ERR_MSG"
		return 1
		;;
	esac
	for _id in $RESULTS_SENT; do rm -f "$RESULTS/$_id"; done
	if [ "$_reboot" = 1 ] && ! results_left; then
		reboot_now
	fi
	set_interval "$ANS_INTERVAL"
	log debug "pushed seq=$SEQ config_version=$CONFIG_VERSION"
	case $ANS_VERSION in
	'' | *[!0-9]*) ;;
	*)
		if [ ! -s "$RUN/data" ]; then
			log error "the server's answer carries configuration version $ANS_VERSION without data"
		else
			apply_config "$ANS_VERSION" && HOOK_RAN=1
		fi
		;;
	esac
	run_commands
	[ "$CMDS_RAN" = 0 ] || MORE=1
	fw_step && MORE=1
	results_left && MORE=1
	return 0
}

# --- main loop -------------------------------------------------------------

log info "agent starting: server=$SERVER machine_id=$MACHINE_ID device_id=$DEVICE_ID device_type=$DEVICE_TYPE firmware=$FIRMWARE"
fw_start
proc_state # the first CPU sample; the first push measures from here
JUST_REGISTERED=0
REPORTED=0
while :; do
	if [ -z "$TOKEN" ]; then
		register
		case $? in
		0) JUST_REGISTERED=1 ;;
		2)
			[ "$ONCE" = 0 ] || exit 1
			sleep_s "$ENROLL_RETRY"
			continue
			;;
		*)
			[ "$ONCE" = 0 ] || exit 1
			retry_delay
			log info "retrying in $RETRY_DELAY s"
			sleep_s "$RETRY_DELAY"
			continue
			;;
		esac
	fi
	_start=$(date +%s)
	REPORTING=$REPORTED
	push
	case $? in
	0)
		BO_N=0
		JUST_REGISTERED=0
		if [ "$HOOK_RAN" = 1 ] && [ "$REPORTED" = 0 ]; then
			REPORTED=1
			continue # report the hook's result now
		fi
		REPORTED=0
		[ "$MORE" = 0 ] || continue # command results, firmware state
		if [ "$ONCE" = 1 ]; then
			[ -z "$CONFIG_ERROR" ] || die "configuration version $FAILED_VERSION is not applied: $CONFIG_ERROR"
			exit 0
		fi
		sleep_s $((INTERVAL - ($(date +%s) - _start)))
		;;
	3)
		log warn "token refused (401); registering again"
		OLD_TOKEN=$TOKEN
		TOKEN=
		save_state
		if [ "$JUST_REGISTERED" = 1 ]; then
			[ "$ONCE" = 0 ] || exit 1
			retry_delay
			sleep_s "$RETRY_DELAY"
		fi
		;;
	*)
		[ "$ONCE" = 0 ] || exit 1
		retry_delay
		log info "retrying in $RETRY_DELAY s"
		sleep_s "$RETRY_DELAY"
		;;
	esac
done
