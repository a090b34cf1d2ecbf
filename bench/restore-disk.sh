#!/usr/bin/env bash
# bench/restore-disk.sh: restores of a many-file tree to the disk that holds bench/out (never a
# tmpfs), the measurements issue 24 asks for. QSM from its embedded store and through a real
# `qsm server` (plaintext TCP on 127.0.0.1) beside restic, rustic, Borg, bupstash, `cp -a` and
# `tar -x` of the same tree, run round-robin (each tool once per round into a new directory,
# `sync` run before each; the order rotated each round; the round's trees removed only after
# it: on this disk, creating files just after removing a large tree is several times slower
# than after creating one, docs/PERFORMANCE.md section 17), every round and the best round of
# each tool reported: restores on this machine swing several-fold from round to round (--settle). Also the peak memory of each tool's
# restore, the ratios of QSM's best rounds to `cp -a`'s and restic's, and the system calls of one
# QSM restore of each kind (strace -c -f), the per-file cost a tmpfs would hide.
#
#   bench/restore-disk.sh [--rounds N] [--pause S] [--settle S] [--large | --large-only] [SOURCE_DIR]
#
#   --rounds N     rounds of every tool (default 5)
#   --pause S      seconds of idle before each restore (default 0)
#   --settle S     seconds to wait after removing a round's trees (default 305): ext4 without
#                  a journal will not reuse an inode deleted in the last 5 s, or 5 min when its
#                  inode table block is dirty (fs/ext4/ialloc.c, recently_deleted), and every
#                  file created within that time scans past the inodes a removal just freed:
#                  on this machine's disk that made restores 5-10x slower, for every tool
#   SOURCE_DIR     the tree to restore (default: the Linux kernel's sources, unpacked by
#                  bench/suite/data.py under bench/out/suite/data/linux)
#   --large        then the large-file part: a set of 4 files of real content (2 GiB in all:
#                  text, executables, compressed data, made once by bench/suite/data.py under
#                  bench/out/restore-disk/large), `qsm restore` of it against `cat` of the same
#                  files into the same disk, round-robin
#   --large-only   the large-file part alone
#
#   QSM_BIN=PATH            a qsm binary to measure instead of this tree's release build (then
#                           cargo is not run)
#   QSM_BENCH_LARGE_MB=N    the large set's size in MiB (default 2048; 4 files of N/4 MiB)
#
# Times include the `sync` that follows each restore: until then the data is only in the page
# cache. What each restore reads (the tool's repository or store, the source for `cp -a`, the
# tarball for `tar -x`) is read once just before it, untimed, so every tool reads from the page
# cache and the time is the writing. Each tool's first restore is compared with the source
# (contents with `diff -rq`, and every entry's type, mode and symlink target, each file's size
# and modification second); a wrong restore stops the script. Peers skip with a note when their
# command is missing; rustic and bupstash are looked for in ~/.cargo/bin too, restic and Borg
# are installed from Debian with apt-get when missing. The peers' repositories and the tarball
# are made once per source tree and kept (bench/out/restore-disk/tree/*) while the tree is
# unchanged; QSM's stores are made afresh on every run, by the binary measured.
# Writes bench/out/restore-disk.md and prints it.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="bench/restore-disk.sh"
for a in "$@"; do CMDLINE+=" $(printf %q "$a")"; done
[ -n "${QSM_BIN:-}" ] && CMDLINE="QSM_BIN=$(printf %q "$QSM_BIN") $CMDLINE"
[ -n "${QSM_BENCH_LARGE_MB:-}" ] && CMDLINE="QSM_BENCH_LARGE_MB=$QSM_BENCH_LARGE_MB $CMDLINE"

usage() { sed -n '13,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
ROUNDS=5 PAUSE=0 SETTLE=305 TREE=1 LARGE=0 ARG=
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
	--pause) PAUSE=${2:?--pause needs a number of seconds}; shift 2 ;;
	--settle) SETTLE=${2:?--settle needs a number of seconds}; shift 2 ;;
	--large) LARGE=1; shift ;;
	--large-only) LARGE=1 TREE=0; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) usage >&2; exit 2 ;;
	*) [ -z "$ARG" ] || { usage >&2; exit 2; }; ARG=$1; shift ;;
	esac
done
case $ROUNDS in '' | *[!0-9]* | 0) echo "--rounds: a positive number, not '$ROUNDS'" >&2; exit 2 ;; esac
case $PAUSE in '' | *[!0-9]*) echo "--pause: a number of seconds, not '$PAUSE'" >&2; exit 2 ;; esac
case $SETTLE in '' | *[!0-9]*) echo "--settle: a number of seconds, not '$SETTLE'" >&2; exit 2 ;; esac
ROUNDS_WORD=rounds
PAUSE_NOTE=
[ "$PAUSE" = 0 ] || PAUSE_NOTE=" The disk left idle for $PAUSE s before each restore."
[ "$ROUNDS" != 1 ] || ROUNDS_WORD=round

OUT="$REPO/bench/out/restore-disk"
mkdir -p "$OUT"
case "$(stat -f -c %T "$OUT")" in
tmpfs | ramfs) echo "bench/out is on a tmpfs: restores must go to a disk" >&2; exit 1 ;;
esac
LOGS="$OUT/logs"
rm -rf "$LOGS" && mkdir -p "$LOGS"
DEST="$OUT/dest"
RSSF="$OUT/rss"
REPORT="$OUT/report.tmp"
: >"$REPORT"
# Nothing of the caller's QSM client settings: the embedded runs must use the embedded store.
unset QSM_SERVER QSM_NODE QSM_PASSWORD_FILE QSM_CA QSM_CONFIG QSM_INSECURE QSM_HOME QSM_KEY_FILE
export PATH="$PATH:$HOME/.cargo/bin"
PW=bench-password

say() { echo "restore-disk: $*" >&2; }
fail() { # MESSAGE [LOG]: stops the script, loudly
	echo >&2
	echo "restore-disk: FAILED: $1" >&2
	if [ -n "${2:-}" ] && [ -f "$2" ]; then echo "--- last lines of $2:" >&2; tail -20 "$2" >&2; fi
	exit 1
}
SERVER_PID=
stop_server() {
	if [ -n "$SERVER_PID" ]; then
		kill "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
		SERVER_PID=
	fi
}
trap stop_server EXIT

# --- tools ------------------------------------------------------------------------------------
need=()
if [ "$TREE" = 1 ]; then
	command -v restic >/dev/null || need+=(restic)
	command -v borg >/dev/null || need+=(borgbackup)
	command -v strace >/dev/null || need+=(strace)
fi
[ -x /usr/bin/time ] || need+=(time)
if [ ${#need[@]} -gt 0 ]; then
	say "installing ${need[*]} with apt-get"
	{ apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; } ||
		say "apt-get could not install ${need[*]}: what is missing is skipped"
fi
[ -x /usr/bin/time ] || fail "GNU time (/usr/bin/time) is needed for peak memory"
if [ "$TREE" = 1 ]; then command -v strace >/dev/null || fail "strace is needed"; fi
# QSM_BIN: a qsm binary to measure instead of this tree's release build.
if [ -z "${QSM_BIN:-}" ]; then cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2; fi
QSM=$(realpath "${QSM_BIN:-$REPO/target/release/qsm}")
[ -x "$QSM" ] || fail "no qsm binary at $QSM"

lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
f2() { printf %.2f "$1"; }
# timed CMD...: runs CMD between two syncs, its wall seconds (the second sync included, so
# what the page cache held is on the disk) in $secs; returns CMD's status.
timed() {
	local s e rc=0
	sync
	s=$(date +%s.%N)
	"$@" || rc=$?
	sync
	e=$(date +%s.%N)
	secs=$(awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f", e - s }')
	return "$rc"
}
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mbs() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / 1e6 / s }'; }
mb() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
first_line() { "$@" 2>&1 | head -1 || true; }
# Reads every file below the directories given into the page cache.
warm() { find "$@" -type f -exec cat {} + >/dev/null 2>&1 || true; }
# An entry per line, sorted: path, type, mode, symlink target, and for files size and mtime
# (seconds). Directories' sizes and times are left out (they depend on how the tree was made).
listing() {
	(cd "$1" && find . -mindepth 1 -printf '%P\t%y\t%m\t%l\t%s\t%T@\n') |
		awk -F'\t' -v OFS='\t' '{ if ($2 == "f") $6 = int($6); else { $5 = ""; $6 = "" } print }' |
		sort
}
# check NAME SOURCE RESTORED [contents]: RESTORED must hold what SOURCE holds (with
# `contents`, the same contents alone: `cat` keeps no modification times).
check() {
	local name=$1 src=$2 got=$3 what=${4:-all}
	[ -d "$got" ] || fail "$name: restored nothing at $got"
	if ! diff -rq --no-dereference "$src" "$got" >"$LOGS/check-$name.txt" 2>&1; then
		fail "$name: the restore in $got differs from $src" "$LOGS/check-$name.txt"
	fi
	if [ "$what" = all ] && ! diff <(listing "$src") <(listing "$got") >"$LOGS/check-$name.txt" 2>&1; then
		fail "$name: the restore in $got has other types, modes, sizes or times than $src (< source, > restored)" "$LOGS/check-$name.txt"
	fi
	say "$name: restore checked, same as the source"
}
# finish: the report to bench/out/restore-disk.md and stdout
finish() {
	printf '\nThe whole run took %d min %02d s.\n' $((SECONDS / 60)) $((SECONDS % 60)) >>"$REPORT"
	mv "$REPORT" "$OUT.md"
	cat "$OUT.md"
}
GIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]; then GIT="$GIT, with uncommitted changes"; fi
if [ -n "${QSM_BIN:-}" ]; then QSM_FROM="$QSM, built $(date -u -r "$QSM" '+%Y-%m-%d %H:%M UTC')"; else QSM_FROM="this tree's release build ($GIT)"; fi

{
	echo "# Restores to a disk (issue 24)"
	echo
	echo "Command: \`$CMDLINE\`"
	echo
	echo "Machine: $(uname -n), $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM, $(uname -r); $(date -u '+%Y-%m-%d %H:%M UTC')."
	echo "Restores go to new directories under \`${OUT#"$REPO"/}\` on $(df --output=source "$OUT" | tail -1) ($(findmnt -no FSTYPE -T "$OUT"), $(findmnt -no OPTIONS -T "$OUT")),"
	echo "the disk that also holds the sources, repositories and stores. Each time includes the \`sync\`"
	echo "after the restore; before it \`sync\` is run and what the restore reads (repository, store,"
	echo "source or tarball) read once into the page cache, untimed. Each restore goes to a new"
	echo "directory; a round's trees are removed after the round (untimed), and the next round waits"
	echo "$SETTLE s after the removal (\`--settle\`): ext4 without a journal, as this disk is, will"
	echo "not reuse an inode deleted in the last 5 s, or 5 min when its inode table block is dirty"
	echo "(fs/ext4/ialloc.c, \`recently_deleted\`), and files created in that time scan past the inodes"
	echo "just freed. The order of the tools is rotated each round."
	echo
	echo "- QSM: $(first_line "$QSM" --version) ($QSM_FROM)"
} >>"$REPORT"

# === Part 1: the tree ===========================================================================
if [ "$TREE" = 1 ]; then
	if [ -n "$ARG" ]; then
		[ -d "$ARG" ] || fail "$ARG is not a directory"
		SRC=$(realpath "$ARG")
	else
		say "the Linux kernel tree (bench/suite/data.py)"
		SRC=$(cd "$REPO" && python3 -c 'import sys; sys.path.insert(0, "bench/suite"); import data; print(data.kernel_tree(1))' | tail -1)
		SRC=$(realpath "$SRC")
	fi
	case "$OUT/" in "$SRC"/*) fail "the source $SRC holds bench/out/restore-disk itself" ;; esac
	ENTRIES=$(find "$SRC" -mindepth 1 | wc -l)
	FILES=$(find "$SRC" -type f | wc -l)
	BYTES=$(du -sb "$SRC" | cut -f1)

	# The peers' repositories and the tarball, kept per source tree while it is unchanged.
	W="$OUT/tree/$(printf %s "$SRC" | md5sum | cut -c1-12)"
	STAMP=$(find "$SRC" -printf '%P\t%y\t%m\t%s\t%T@\t%l\n' | sort | md5sum | cut -c1-32)
	if [ "$(cat "$W/stamp" 2>/dev/null)" != "$STAMP" ]; then
		rm -rf "$W"
		mkdir -p "$W"
		echo "$SRC" >"$W/source"
		echo "$STAMP" >"$W/stamp"
	fi

	# Each tool's environment: peers exactly as bench/suite/peers.py sets them (repository
	# $W/TOOL/repo), QSM with its own HOME so no ~/.config/qsm applies.
	QE=(env HOME="$W/qsm" QSM_HOME="$W/qsm/home")
	QS=() # QSM through the server: set once it listens
	RE=(env RESTIC_PASSWORD="$PW" RESTIC_CACHE_DIR="$W/restic/repo.cache")
	RU=(env RUSTIC_PASSWORD="$PW" RUSTIC_REPOSITORY="$W/rustic/repo" RUSTIC_CACHE_DIR="$W/rustic/repo.cache" HOME="$W/rustic")
	BO=(env BORG_PASSPHRASE="$PW" BORG_CACHE_DIR="$W/borg/repo.cache" BORG_CONFIG_DIR="$W/borg/repo.config"
		BORG_BASE_DIR="$W/borg" BORG_RELOCATED_REPO_ACCESS_IS_OK=yes)
	BU=(env BUPSTASH_REPOSITORY="$W/bupstash/repo" BUPSTASH_KEY="$W/bupstash/repo.key" HOME="$W/bupstash"
		XDG_CACHE_HOME="$W/bupstash/repo.cache")

	name() {
		case $1 in
		qsm) echo "QSM embedded" ;; qsm-server) echo "QSM server" ;; borg) echo "Borg" ;;
		cp) echo "\`cp -a\`" ;; tar) echo "\`tar -x\`" ;; *) echo "$1" ;;
		esac
	}
	version() {
		case $1 in
		qsm | qsm-server) first_line "$QSM" --version ;;
		restic) first_line restic version ;;
		rustic) first_line rustic --version ;;
		borg) first_line borg --version ;;
		bupstash) first_line bupstash version ;;
		cp) first_line cp --version ;;
		tar) first_line tar --version ;;
		esac
	}
	TOOLS=(qsm qsm-server) MISSING=()
	for t in restic rustic borg bupstash; do
		if command -v "$t" >/dev/null; then TOOLS+=("$t"); else MISSING+=("$t"); fi
	done
	TOOLS+=(cp tar)
	for t in "${MISSING[@]}"; do say "$t is not installed: not measured"; done

	# A peer's backup, once: kept while the source is unchanged (its `done` marks it complete).
	peer_backup() {
		local d="$W/$1"
		[ -f "$d/done" ] && return 0
		say "$1: backing up $SRC (once)"
		rm -rf "$d" && mkdir -p "$d"
		case $1 in
		restic) "${RE[@]}" restic init -q -r "$d/repo" && "${RE[@]}" restic -q -r "$d/repo" backup "$SRC" ;;
		rustic) "${RU[@]}" rustic init && "${RU[@]}" rustic backup "$SRC" ;;
		borg) "${BO[@]}" borg init -e repokey-blake2 "$d/repo" && "${BO[@]}" borg create "$d/repo::b1" "$SRC" ;;
		bupstash) "${BU[@]}" bupstash init && "${BU[@]}" bupstash new-key -o "$d/repo.key" &&
			"${BU[@]}" bupstash put run=b1 "$SRC" ;;
		tar) tar -C "$(dirname "$SRC")" -cf "$d/src.tar" "$(basename "$SRC")" ;;
		esac >"$LOGS/$1-backup.log" 2>&1 || fail "$1: the backup of $SRC failed" "$LOGS/$1-backup.log"
		touch "$d/done"
	}
	for t in "${TOOLS[@]}"; do
		case $t in qsm | qsm-server | cp) ;; *) peer_backup "$t" ;; esac
	done

	# QSM: both stores afresh, by the binary measured.
	rm -rf "$W/qsm" && mkdir -p "$W/qsm"
	printf '%s\n' "$PW" >"$W/qsm/pw" && chmod 600 "$W/qsm/pw"
	say "QSM embedded: backing up $SRC"
	"${QE[@]}" "$QSM" backup "$SRC" >"$LOGS/qsm-backup.log" 2>&1 || fail "qsm backup failed" "$LOGS/qsm-backup.log"
	SRV="$W/qsm/server"
	"$QSM" server --data-dir "$SRV" --listen 127.0.0.1:0 --plaintext >"$LOGS/server.log" 2>&1 &
	SERVER_PID=$!
	for _ in $(seq 200); do
		grep -qs 'listening on http://' "$LOGS/server.log" && grep -qs 'listening on unix:' "$LOGS/server.log" && break
		kill -0 "$SERVER_PID" 2>/dev/null || break
		sleep 0.1
	done
	URL=$(grep -o 'http://[^ ]*' "$LOGS/server.log" | head -1 || true)
	if ! grep -q 'listening on unix:' "$LOGS/server.log" || [ -z "$URL" ]; then fail "qsm server did not start" "$LOGS/server.log"; fi
	echo "$PW" | "$QSM" admin --server "unix:$SRV/qsm.sock" register-node bench >"$LOGS/register.log" 2>&1 ||
		fail "register-node failed" "$LOGS/register.log"
	QS=(env HOME="$W/qsm" QSM_SERVER="$URL" QSM_NODE=bench QSM_PASSWORD_FILE="$W/qsm/pw")
	say "QSM server ($URL): backing up $SRC"
	"${QS[@]}" "$QSM" backup "$SRC" >"$LOGS/qsm-server-backup.log" 2>&1 ||
		fail "qsm backup through the server failed" "$LOGS/qsm-server-backup.log"

	# What each restore reads, and where the restored tree lands (restic, rustic and Borg
	# restore the source's absolute path below the target, tar its last component).
	inputs() {
		case $1 in
		qsm) echo "$W/qsm/home" ;; qsm-server) echo "$SRV" ;; cp) echo "$SRC" ;; *) echo "$W/$1" ;;
		esac
	}
	restored() {
		case $1 in
		restic | rustic | borg) echo "$DEST$SRC" ;; tar) echo "$DEST/$(basename "$SRC")" ;; *) echo "$DEST" ;;
		esac
	}
	# One restore into $DEST, under GNU time (peak memory in KB to $RSSF).
	restore() {
		local gt=(/usr/bin/time -q -f %M -o "$RSSF")
		case $1 in
		qsm) "${gt[@]}" "${QE[@]}" "$QSM" restore "$SRC" --to "$DEST" ;;
		qsm-server) "${gt[@]}" "${QS[@]}" "$QSM" restore "$SRC" --to "$DEST" ;;
		restic) "${gt[@]}" "${RE[@]}" restic -q -r "$W/restic/repo" restore latest --target "$DEST" ;;
		rustic) "${gt[@]}" "${RU[@]}" rustic restore latest "$DEST" ;;
		borg) mkdir -p "$DEST" && (cd "$DEST" && "${gt[@]}" "${BO[@]}" borg extract "$W/borg/repo::b1") ;;
		bupstash) mkdir -p "$DEST" && "${gt[@]}" "${BU[@]}" bupstash restore --into "$DEST" run=b1 ;;
		cp) "${gt[@]}" cp -a "$SRC" "$DEST" ;;
		tar) mkdir -p "$DEST" && "${gt[@]}" tar -C "$DEST" -xf "$W/tar/src.tar" ;;
		esac >>"$LOGS/$1.log" 2>&1
	}

	declare -A SECS RSS BEST BESTR MAXRSS
	DESTS="$OUT/dests"
	# settle: after a removal, until ext4 reuses the freed inodes without scanning past them
	# (--settle above).
	settle() {
		[ "$SETTLE" = 0 ] && return
		say "waiting $SETTLE s after the removal (--settle)"
		sleep "$SETTLE"
	}
	# An earlier run's trees, if any were left (an empty directory frees no inodes).
	if [ -n "$(ls -A "$DESTS" 2>/dev/null)" ]; then rm -rf "$DESTS" && sync && settle; fi
	mkdir -p "$DESTS"
	for r in $(seq 1 "$ROUNDS"); do
		n=${#TOOLS[@]}
		for i in $(seq 0 $((n - 1))); do
			t=${TOOLS[$(((i + r - 1) % n))]}
			warm "$(inputs "$t")"
			DEST="$DESTS/$r-$t"
			sleep "$PAUSE"
			timed restore "$t" || fail "$t: the restore failed" "$LOGS/$t.log"
			SECS[$t,$r]=$secs
			RSS[$t,$r]=$(tail -1 "$RSSF")
			say "round $r/$ROUNDS: $(name "$t") $(f2 "$secs") s, $(mb "${RSS[$t,$r]}") MB"
			if [ -z "${BEST[$t]:-}" ] || lt "$secs" "${BEST[$t]}"; then BEST[$t]=$secs BESTR[$t]=$r; fi
			if [ -z "${MAXRSS[$t]:-}" ] || [ "${RSS[$t,$r]}" -gt "${MAXRSS[$t]}" ]; then MAXRSS[$t]=${RSS[$t,$r]}; fi
			if [ "$r" = 1 ]; then check "$t" "$SRC" "$(restored "$t")"; fi
		done
		rm -rf "$DESTS" && mkdir -p "$DESTS" && sync
		[ "$r" = "$ROUNDS" ] || settle
	done
	DEST="$OUT/dest"

	# System calls of one restore of each kind (for the server, of the client process).
	rm -rf "$DEST" && sync
	"${QE[@]}" strace -c -f -o "$OUT/strace-embedded.txt" "$QSM" restore "$SRC" --to "$DEST" >>"$LOGS/strace.log" 2>&1 ||
		fail "qsm restore under strace failed" "$LOGS/strace.log"
	rm -rf "$DEST" && sync
	"${QS[@]}" strace -c -f -o "$OUT/strace-server.txt" "$QSM" restore "$SRC" --to "$DEST" >>"$LOGS/strace.log" 2>&1 ||
		fail "qsm restore through the server under strace failed" "$LOGS/strace.log"
	rm -rf "$DEST"
	stop_server
	calls() { local v; v=$(awk -v c="$2" '$NF == c { print $4 }' "$1"); echo "${v:-0}"; }
	# the 12 system calls made most often by either restore, by the embedded restore's count
	SYSCALLS=$(for f in "$OUT/strace-embedded.txt" "$OUT/strace-server.txt"; do
		awk '$4 ~ /^[0-9]+$/ && $NF != "total" { print $4, $NF }' "$f" | sort -rn | awk 'NR <= 12 { print $2 }'
	done | sort -u | while read -r c; do echo "$(calls "$OUT/strace-embedded.txt" "$c") $c"; done | sort -rn | awk '{ print $2 }')

	{
		echo "- $(for t in "${TOOLS[@]}"; do case $t in qsm*) ;; *) printf '%s: %s; ' "$(name "$t")" "$(version "$t")" ;; esac; done | sed 's/; $//')"
		if [ ${#MISSING[@]} -gt 0 ]; then echo "- not installed, so not measured: ${MISSING[*]}"; fi
		echo
		echo "## The tree: $FILES files, $ENTRIES entries, $(awk -v b="$BYTES" 'BEGIN { printf "%.0f", b / 1e6 }') MB (\`$SRC\`)"
		echo
		echo "QSM embedded: \`qsm restore SRC --to DEST\` from the embedded store (\`QSM_HOME\`); QSM server:"
		echo "the same through \`qsm server --plaintext\` on 127.0.0.1 (\`QSM_SERVER=http://...\`), server and"
		echo "client on this machine; both backed up with \`qsm backup SRC\` at its defaults. Peers at their"
		echo "defaults as bench/suite/peers.py runs them (restic, rustic, Borg and bupstash encrypt and"
		echo "deduplicate; QSM does neither by default); \`cp -a SRC DEST\`; \`tar -xf\` of an uncompressed"
		echo "tarball of SRC. $ROUNDS $ROUNDS_WORD, round-robin (round r starts with the r-th column); the best round of each"
		echo "tool in bold.${PAUSE_NOTE}"
		echo
		printf '| round |'; for t in "${TOOLS[@]}"; do printf ' %s |' "$(name "$t")"; done; echo
		printf '|---|'; for _ in "${TOOLS[@]}"; do printf -- '---|'; done; echo
		for r in $(seq 1 "$ROUNDS"); do
			printf '| %s |' "$r"
			for t in "${TOOLS[@]}"; do
				if [ "${BESTR[$t]}" = "$r" ]; then printf ' **%s s** |' "$(f2 "${SECS[$t,$r]}")"; else printf ' %s s |' "$(f2 "${SECS[$t,$r]}")"; fi
			done
			echo
		done
		echo
		echo "| tool | best round | MB/s (best) | peak memory, best round | peak memory, max over rounds |"
		echo "|---|---|---|---|---|"
		for t in "${TOOLS[@]}"; do
			echo "| $(name "$t") | $(f2 "${BEST[$t]}") s (round ${BESTR[$t]}) | $(mbs "$BYTES" "${BEST[$t]}") | $(mb "${RSS[$t,${BESTR[$t]}]}") MB | $(mb "${MAXRSS[$t]}") MB |"
		done
		echo
		echo "Peak memory: the maximum resident set (GNU \`time -f %M\`) of the restoring process (for QSM"
		echo "server, of the client; the server process is not counted)."
		echo
		echo "Ratios of best rounds (time / time; below 1 QSM is faster):"
		echo
		echo "| | \`cp -a\` | restic |"
		echo "|---|---|---|"
		for q in qsm qsm-server; do
			if [ -n "${BEST[restic]:-}" ]; then rr=$(div "${BEST[$q]}" "${BEST[restic]}"); else rr="n/a (restic not measured)"; fi
			echo "| $(name "$q") | $(div "${BEST[$q]}" "${BEST[cp]}") | $rr |"
		done
		echo
		echo "System calls of one QSM restore of the tree (\`strace -c -f\`; for the server, of the client"
		echo "process), the calls made most often, for $ENTRIES entries:"
		echo
		echo "| system call | QSM embedded | QSM server (client) |"
		echo "|---|---|---|"
		echo "| all | $(calls "$OUT/strace-embedded.txt" total) | $(calls "$OUT/strace-server.txt" total) |"
		for c in $SYSCALLS; do
			echo "| $c | $(calls "$OUT/strace-embedded.txt" "$c") | $(calls "$OUT/strace-server.txt" "$c") |"
		done
	} >>"$REPORT"
fi

# === Part 2: large files ========================================================================
if [ "$LARGE" = 1 ]; then
	LMB=${QSM_BENCH_LARGE_MB:-2048}
	case $LMB in '' | *[!0-9]*) fail "QSM_BENCH_LARGE_MB: a number of MiB, not '$LMB'" ;; esac
	[ "$LMB" -ge 4 ] || fail "QSM_BENCH_LARGE_MB: at least 4"
	FSIZE=$((LMB * 1048576 / 4))
	LARGE_SET="$OUT/large/${LMB}MiB"
	mkdir -p "$LARGE_SET"
	say "the large set: 4 files of $((FSIZE >> 20)) MiB under $LARGE_SET (made once)"
	# bench/suite/data.py's streams: the kernel tarball's uncompressed text (2 consecutive
	# slices), the ELF files under /usr and the Rust toolchain concatenated, and the kernel's
	# .tar.xz followed by zlib-compressed executables.
	(cd "$REPO" && python3 -c '
import sys
sys.path.insert(0, "bench/suite")
import data
size, where = int(sys.argv[1]), sys.argv[2]
for kind, count in (("text", 2), ("executables", 1), ("compressed", 1)):
    data.files_of(kind, size, count, where)
' "$FSIZE" "$LARGE_SET") || fail "making the large set failed"
	mapfile -t LFILES < <(cd "$LARGE_SET" && find . -mindepth 2 -type f -printf '%P\n' | sort)
	[ ${#LFILES[@]} = 4 ] || fail "the large set $LARGE_SET has ${#LFILES[@]} files, not 4 (remove it)"
	LBYTES=$(cd "$LARGE_SET" && find . -mindepth 2 -type f -printf '%s\n' | awk '{ n += $1 } END { print n }')
	LW="$OUT/large-qsm"
	rm -rf "$LW" && mkdir -p "$LW"
	LQE=(env HOME="$LW" QSM_HOME="$LW/home")
	say "QSM embedded: backing up $LARGE_SET"
	"${LQE[@]}" "$QSM" backup "$LARGE_SET" >"$LOGS/large-backup.log" 2>&1 || fail "qsm backup of the large set failed" "$LOGS/large-backup.log"

	lrestore() {
		case $1 in
		qsm) /usr/bin/time -q -f %M -o "$RSSF" "${LQE[@]}" "$QSM" restore "$LARGE_SET" --to "$DEST" >>"$LOGS/large-qsm.log" 2>&1 ;;
		cat)
			local f
			for f in "${LFILES[@]}"; do
				mkdir -p "$DEST/$(dirname "$f")" && cat "$LARGE_SET/$f" >"$DEST/$f" || return 1
			done
			;;
		esac
	}
	declare -A LSECS LBEST LBESTR
	declare -a LRSS
	for r in $(seq 1 "$ROUNDS"); do
		for t in qsm cat; do
			if [ "$t" = qsm ]; then warm "$LW/home"; else warm "$LARGE_SET"; fi
			rm -rf "$DEST" && sync
			sleep "$PAUSE"
			timed lrestore "$t" || fail "large files: $t failed" "$LOGS/large-qsm.log"
			LSECS[$t,$r]=$secs
			if [ "$t" = qsm ]; then LRSS[r]=$(tail -1 "$RSSF"); fi
			say "large files, round $r/$ROUNDS: $t $(f2 "$secs") s"
			if [ -z "${LBEST[$t]:-}" ] || lt "$secs" "${LBEST[$t]}"; then LBEST[$t]=$secs LBESTR[$t]=$r; fi
			if [ "$r" = 1 ]; then check "large-$t" "$LARGE_SET" "$DEST" "$([ "$t" = cat ] && echo contents || echo all)"; fi
		done
	done
	rm -rf "$DEST"

	{
		echo
		echo "## Large files: 4 files, $((LBYTES >> 20)) MiB (\`${LARGE_SET#"$REPO"/}\`)"
		echo
		echo "Two consecutive $((FSIZE >> 20)) MiB slices of the kernel tarball's uncompressed text, $((FSIZE >> 20)) MiB of"
		echo "executables (the ELF files under /usr and the Rust toolchain, concatenated) and $((FSIZE >> 20)) MiB of"
		echo "compressed data (the kernel's .tar.xz, then zlib-compressed executables), made by"
		echo "bench/suite/data.py. QSM: backed up once with \`qsm backup\` into an embedded store, then"
		echo "\`qsm restore SET --to DEST\`; \`cat\`: \`cat FILE > DEST/FILE\` for each file, the same bytes into"
		echo "the same disk, the files in the page cache (read just before, untimed), so \`cat\` measures the"
		echo "writing alone. $ROUNDS $ROUNDS_WORD, round-robin, \`sync\` included, best round in bold."
		echo
		echo "| round | QSM embedded restore | \`cat\` |"
		echo "|---|---|---|"
		for r in $(seq 1 "$ROUNDS"); do
			printf '| %s |' "$r"
			for t in qsm cat; do
				if [ "${LBESTR[$t]}" = "$r" ]; then printf ' **%s s** |' "$(f2 "${LSECS[$t,$r]}")"; else printf ' %s s |' "$(f2 "${LSECS[$t,$r]}")"; fi
			done
			echo
		done
		echo
		echo "Best rounds: QSM $(mbs "$LBYTES" "${LBEST[qsm]}") MB/s (peak memory $(mb "${LRSS[${LBESTR[qsm]}]}") MB), \`cat\` $(mbs "$LBYTES" "${LBEST[cat]}") MB/s;"
		echo "**QSM speed / \`cat\` speed = $(div "${LBEST[cat]}" "${LBEST[qsm]}")** (1: QSM restores these files as fast as \`cat\` writes the same bytes)."
	} >>"$REPORT"
fi

finish
