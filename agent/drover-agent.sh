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
ROOT=
DISK_PATH=/
INTERFACES=
MIN_BACKOFF=2
MAX_BACKOFF=300
ENROLL_RETRY=600
TIMEOUT=30
ONCE=0
LOG_LEVEL=info

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
  --machine-id S            machine ID (default: generated once, kept in the state directory)
  --root D                  read /proc, /sys and /etc under D (for tests)
  --disk-path P             file system whose usage is reported (default /; /overlay on OpenWrt)
  --interfaces LIST         comma-separated glob patterns of interfaces (default: all but lo)
  --min-backoff T           first retry delay after an error (default 2)
  --max-backoff T           longest retry delay (default 300)
  --enroll-retry T          wait after a rejected enrollment secret (default 600)
  --timeout T               timeout of one request (default 30)
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
	--allow-http | --once | --help | -h) ;;
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
	--root) ROOT=${val%/} ;;
	--disk-path) DISK_PATH=$val ;;
	--interfaces) INTERFACES=$val ;;
	--min-backoff) MIN_BACKOFF=$val ;;
	--max-backoff) MAX_BACKOFF=$val ;;
	--enroll-retry) ENROLL_RETRY=$val ;;
	--timeout) TIMEOUT=$val ;;
	--once) ONCE=1 ;;
	--log-level) LOG_LEVEL=$val ;;
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
for _v in HOOK_TIMEOUT HOOK_RETRY COLLECTOR_TIMEOUT MIN_BACKOFF MAX_BACKOFF ENROLL_RETRY TIMEOUT; do
	eval "_s=\$$_v"
	_n=$(seconds "$_s") || die "$_v: '$_s' is not a duration"
	eval "$_v=$_n"
done
case $LOG_LEVEL in debug | info | warn | error) ;; *) die "--log-level must be debug, info, warn or error" ;; esac
[ -n "$SERVER" ] || die "--server is required"
SERVER=${SERVER%/}
case $SERVER in
https://?*) ;;
http://?*) [ "$ALLOW_HTTP" = 1 ] || die "--server uses http://, which sends the token in clear; use https:// or pass --allow-http" ;;
*) die "--server must be an https:// URL" ;;
esac
[ "$MIN_BACKOFF" -ge 1 ] && [ "$MAX_BACKOFF" -ge "$MIN_BACKOFF" ] || die "--max-backoff must be at least --min-backoff, which must be at least 1"
[ "$TIMEOUT" -ge 1 ] || die "--timeout must be at least 1"
if [ -n "$SECRET_FILE" ]; then
	[ -z "$SECRET" ] || die "--enroll-secret and --enroll-secret-file exclude each other"
	SECRET=$(tr -d ' \r\n\t' <"$SECRET_FILE") || die "cannot read $SECRET_FILE"
fi
[ -z "$CA_CERT" ] || [ -r "$CA_CERT" ] || die "--ca-cert $CA_CERT is not readable"
command -v curl >/dev/null 2>&1 || die "curl is required"

umask 077
mkdir -p "$STATE_DIR" || die "cannot create $STATE_DIR"
RUN=$(mktemp -d "${TMPDIR:-/tmp}/drover-agent.XXXXXX") || die "cannot create a directory in ${TMPDIR:-/tmp}"
CHILD=

cleanup() {
	[ -z "$CHILD" ] || kill "$CHILD" 2>/dev/null
	rm -rf "$RUN"
}
trap 'cleanup; exit 0' TERM INT HUP
trap 'cleanup' EXIT

# bg_wait runs a command in the background and waits, so that TERM is
# handled at once. Background commands read /dev/null unless told: stdin
# comes from the file BG_IN.
BG_IN=/dev/null
bg_wait() {
	"$@" <"$BG_IN" &
	CHILD=$!
	wait "$CHILD"
	_rc=$?
	CHILD=
	return $_rc
}

sleep_s() {
	[ "$1" -gt 0 ] 2>/dev/null || return 0
	log debug "sleeping $1 s"
	bg_wait sleep "$1"
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
# in any order and layout; the raw config.data goes to the file datafile.
AWK_MEMBERS='
function trim(s) { sub(/^[ \t\r\n]+/, "", s); sub(/[ \t\r\n]+$/, "", s); return s }
function unq(v) {
	if (v ~ /^".*"$/) { v = substr(v, 2, length(v) - 2); gsub(/\\"/, "\"", v) }
	return v
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
		} else if (V[i] !~ /^\[/) print K[i] "\t" unq(V[i])
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

# The state file holds KEY=value lines; values never contain newlines. It
# is read, not sourced.
save_state() {
	_t=$STATE_DIR/.state.tmp
	printf 'DEVICE_ID=%s\nTOKEN=%s\nTOKEN_SERVER=%s\nSEQ=%s\nCONFIG_VERSION=%s\nCONFIG_ERROR=%s\nFAILED_VERSION=%s\nFAILED_AT=%s\nDEVICE_KEY=%s\n' \
		"$DEVICE_ID" "$TOKEN" "$SERVER" "$SEQ_RESERVED" "$CONFIG_VERSION" "$CONFIG_ERROR" "$FAILED_VERSION" "$FAILED_AT" "$DEVICE_KEY" >"$_t" &&
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
		esac
	done <"$STATE_DIR/state"
fi
case $SEQ:$CONFIG_VERSION:$FAILED_VERSION:$FAILED_AT in
*[!0-9:]* | *::* | :* | *:) die "$STATE_DIR/state is corrupt; remove it to register again" ;;
esac
SEQ_RESERVED=$SEQ

MACHINE_ID=
[ -f "$STATE_DIR/machine-id" ] && read -r MACHINE_ID <"$STATE_DIR/machine-id"
NEW_MACHINE_ID=0
if [ -n "$MACHINE_ID_ARG" ] && [ "$MACHINE_ID_ARG" != "$MACHINE_ID" ]; then
	MACHINE_ID=$MACHINE_ID_ARG
	NEW_MACHINE_ID=1
elif [ -z "$MACHINE_ID" ]; then
	MACHINE_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	[ ${#MACHINE_ID} -eq 32 ] || die "cannot read /dev/urandom"
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

if [ -r "$ROOT/etc/openwrt_release" ]; then
	_dt=openwrt
	_fw=$(relvar "$ROOT/etc/openwrt_release" DISTRIB_DESCRIPTION)
	[ -n "$_fw" ] || _fw=$(relvar "$ROOT/etc/openwrt_release" DISTRIB_RELEASE)
else
	_dt=$(relvar "$ROOT/etc/os-release" ID)
	_fw=$(relvar "$ROOT/etc/os-release" PRETTY_NAME)
	[ -n "$_dt" ] || _dt=linux
fi
firstline "$ROOT/proc/sys/kernel/osrelease"
KERNEL=$FIRSTLINE
[ -n "$_fw" ] || _fw=$KERNEL
[ -n "$_fw" ] || _fw=unknown
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
	rm -f "$RUN/data"
	LC_ALL=C awk -v datafile="$RUN/data" "$AWK_MEMBERS" "$RUN/resp" >"$RUN/fields" 2>/dev/null || return 0
	while IFS="$TAB" read -r _k _v; do
		case $_k in
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
	if [ "$_ver" -le "$CONFIG_VERSION" ]; then
		log warn "server sent configuration version $_ver, not newer than the applied $CONFIG_VERSION"
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

# push: returns 0 on success (HOOK_RAN=1 when a configuration was handed
# to the hook), 1 on failure, 3 when the token was refused.
HOOK_RAN=0
REPORTING=0
push() {
	HOOK_RAN=0
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
	printf '{"seq":%s,"config_version":%s%s,"state":%s}' "$SEQ" "$CONFIG_VERSION" "$_ce" "$STATE" >"$RUN/body"
	post /api/v1/push "$RUN/body" auth
	case $STATUS in
	200) ;;
	401) return 3 ;;
	*)
		log warn "push failed: $ERR_MSG"
		return 1
		;;
	esac
	set_interval "$ANS_INTERVAL"
	log debug "pushed seq=$SEQ config_version=$CONFIG_VERSION"
	case $ANS_VERSION in '' | *[!0-9]*) return 0 ;; esac
	if [ ! -s "$RUN/data" ]; then
		log error "the server's answer carries configuration version $ANS_VERSION without data"
		return 0
	fi
	apply_config "$ANS_VERSION" && HOOK_RAN=1
	return 0
}

# --- main loop -------------------------------------------------------------

log info "agent starting: server=$SERVER machine_id=$MACHINE_ID device_id=$DEVICE_ID device_type=$DEVICE_TYPE firmware=$FIRMWARE"
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
