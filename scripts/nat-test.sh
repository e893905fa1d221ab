#!/usr/bin/env bash
# Relay circuits behind NAT (spec/relay-circuits.md), with network namespaces. Root only.
#
#   awp-pub  : the "internet" (203.0.113.1 and .5) running the relay on :7700
#   awp-nata : NAT router for awp-a (10.1.0.0/24), masquerading out of 203.0.113.2
#   awp-natb : NAT router for awp-b (10.2.0.0/24), masquerading out of 203.0.113.6
#   awp-a, awp-b : the two nodes; neither accepts connections from outside its NAT
#
# The NAT routers drop unsolicited inbound SYNs (as home routers do). Two rounds:
#   cone      : plain MASQUERADE (ports kept): messages flow through a circuit, survive
#               kill -9 of a, b and the relay (resume, nothing lost), and the direct
#               upgrade happens (logged by both nodes);
#   symmetric : MASQUERADE --random-fully (a new port per connection): messages flow
#               through the circuit, the upgrade fails and the circuit stays.
# A relay that terminates TLS itself (examples/mitm_relay.rs) is refused by the dialer.
#
# Usage: sudo scripts/nat-test.sh        (skips with one line when it cannot run)
# Needs iptables (installed with apt-get when missing). Namespaces are removed on exit.
set -euo pipefail

skip() { echo "nat-test: SKIP: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no ip(8)"
ip netns add awp-probe 2>/dev/null || skip "cannot create network namespaces here"
ip netns del awp-probe
if ! command -v iptables >/dev/null; then
    echo "nat-test: installing iptables"
    (apt-get install -y iptables >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 &&
        apt-get install -y iptables >/dev/null 2>&1)) || skip "iptables missing and not installable"
fi

cd "$(dirname "$0")/.."
. scripts/lib.sh
AWP=$(awp_exe)
MITM=$(cargo_exe mitm_relay --example mitm_relay)
T=$(mktemp -d /tmp/awp-nat.XXXXXX)
NS=(awp-pub awp-nata awp-natb awp-a awp-b)
PIDS=()

cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

fail() { echo "nat-test: FAIL: $*"; for f in "$T"/*.log; do echo "== $f"; tail -n 20 "$f"; done; exit 1; }
in_ns() { local n=$1; shift; ip netns exec "$n" "$@"; }
# awp HOME ARGS…: the CLI in that node's namespace (the node must be running: most
# commands would otherwise start one, without --via).
declare -A NS_OF=([relay]=awp-pub [a]=awp-a [b]=awp-b)
awp() { local home=$1; shift; in_ns "${NS_OF[$home]}" "$AWP" --home "$T/$home" "$@"; }
kill9() { # kill9 PID: SIGKILL and reap (a zombie would keep its home lock "held")
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

link() { # link NS1 IF1 ADDR1 NS2 IF2 ADDR2
    ip link add "$2" netns "$1" type veth peer name "$5" netns "$4"
    in_ns "$1" ip addr add "$3" dev "$2"; in_ns "$1" ip link set "$2" up
    in_ns "$4" ip addr add "$6" dev "$5"; in_ns "$4" ip link set "$5" up
}

setup() { # setup MASQUERADE-OPTIONS
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; ip netns add "$n"; in_ns "$n" ip link set lo up; done
    link awp-pub pa 203.0.113.1/30 awp-nata wan 203.0.113.2/30
    link awp-pub pb 203.0.113.5/30 awp-natb wan 203.0.113.6/30
    link awp-nata lan 10.1.0.1/24 awp-a eth0 10.1.0.2/24
    link awp-natb lan 10.2.0.1/24 awp-b eth0 10.2.0.2/24
    in_ns awp-pub sysctl -qw net.ipv4.ip_forward=1
    in_ns awp-a ip route add default via 10.1.0.1
    in_ns awp-b ip route add default via 10.2.0.1
    for r in nata natb; do
        local peer; [ $r = nata ] && peer=203.0.113.1 || peer=203.0.113.5
        in_ns awp-$r ip route add default via $peer
        in_ns awp-$r sysctl -qw net.ipv4.ip_forward=1
        # shellcheck disable=SC2086
        in_ns awp-$r iptables -t nat -A POSTROUTING -o wan -j MASQUERADE $1
        in_ns awp-$r iptables -A INPUT -i wan -p tcp --syn -j DROP
    done
}

start() { # start NS HOME [args…]: a node in the background, logging to HOME.log
    local n=$1 home=$2; shift 2
    mkdir -p "$T/$home"; chmod 700 "$T/$home"
    RUST_LOG=${RUST_LOG:-info} ip netns exec "$n" "$AWP" "$@" --home "$T/$home" >>"$T/$home.log" 2>&1 &
    PIDS+=($!)
    eval "PID_${home//-/_}=$!"
    for _ in $(seq 100); do awp "$home" status >/dev/null 2>&1 && return 0; sleep 0.1; done
    fail "$home did not start"
}

key_of() { awp "$1" --json status | sed -n 's/.*"key":"\([^"]*\)".*/\1/p'; }
circuit_of() { awp "$1" --json address | tr ',' '\n' | sed -n 's/.*"\(relay:[^"]*\)".*/\1/p' | head -n 1; }

# wait_count HOME N: until HOME holds N inbound messages (30 s at most).
wait_count() {
    local n
    for _ in $(seq 300); do
        n=$(awp "$1" --json tail --once 2>/dev/null | grep -c '"dir":"in".*"t":"msg"' || true)
        [ "$n" -ge "$2" ] && { [ "$n" -eq "$2" ] || fail "$1 holds $n messages, want $2 (duplicates)"; return 0; }
        sleep 0.1
    done
    fail "$1 holds ${n:-0} messages, want $2"
}

round() { # round NAME MASQUERADE-OPTIONS EXPECT-UPGRADE(yes|no)
    local name=$1 masq=$2 expect=$3
    echo "nat-test: round $name"
    setup "$masq"
    rm -rf "${T:?}"/*
    start awp-pub relay relay --listen tls:0.0.0.0:7700
    local rkey via; rkey=$(key_of relay); via="tls:203.0.113.1:7700#$rkey"
    start awp-b b daemon --listen tls:0.0.0.0:7700 --via "$via"
    start awp-a a daemon --listen tls:0.0.0.0:7700 --via "$via"
    local bkey baddr; bkey=$(key_of b); baddr=$(circuit_of b)
    [ -n "$baddr" ] || fail "b has no circuit address"
    echo "nat-test: b is reachable at $baddr"
    # b's direct address is unreachable from a: only the circuit works.
    sleep 1
    awp a connect "$baddr" >/dev/null || fail "connect through the circuit"
    for i in 1 2 3; do awp a send "$bkey" "m$i" >/dev/null; done
    wait_count b 3

    kill9 "$PID_a"
    start awp-a a daemon --listen tls:0.0.0.0:7700 --via "$via"
    for i in 4 5; do awp a send "$bkey" "m$i" >/dev/null; done
    wait_count b 5

    kill9 "$PID_b"
    for i in 6 7; do awp a send "$bkey" "m$i" >/dev/null; done
    start awp-b b daemon --listen tls:0.0.0.0:7700 --via "$via"
    wait_count b 7

    kill9 "$PID_relay"
    for i in 8 9; do awp a send "$bkey" "m$i" >/dev/null; done
    start awp-pub relay relay --listen tls:0.0.0.0:7700
    wait_count b 9
    echo "nat-test: $name: 9 messages through kill -9 of a, b and the relay, each once"

    for _ in $(seq 30); do
        grep -q "direct upgrade" "$T/a.log" "$T/b.log" && break
        sleep 1
    done
    if grep -q "direct upgrade: moving the session" "$T/a.log" "$T/b.log"; then
        [ "$expect" = yes ] || fail "$name: a direct upgrade happened through a symmetric NAT"
        echo "nat-test: $name: direct upgrade happened (logged)"
    else
        [ "$expect" = no ] || fail "$name: no direct upgrade"
        grep -q "direct upgrade failed" "$T/a.log" "$T/b.log" || fail "$name: no upgrade attempt logged"
        awp relay --json relay status | grep -q '"from"' || fail "$name: the circuit did not stay"
        echo "nat-test: $name: upgrade failed, the circuit stays"
    fi
    awp a send "$bkey" "m10" >/dev/null
    wait_count b 10

    if [ "$name" = cone ]; then
        # A relay that terminates TLS itself, on the public network.
        mkdir -p "$T/mitm"
        in_ns awp-pub "$MITM" 0.0.0.0:7800 >"$T/mitm.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 50); do grep -q '^key ' "$T/mitm.log" && break; sleep 0.1; done
        local mkey; mkey=$(sed -n 's/^key //p' "$T/mitm.log")
        if awp a connect "relay:tls:203.0.113.1:7800#$mkey/$bkey" >"$T/mitm-connect.out" 2>&1; then
            fail "a connected through a TLS-terminating relay"
        fi
        grep -qE 'certificate|not the pinned' "$T/mitm-connect.out" || fail "mitm refusal without a key or certificate error: $(cat "$T/mitm-connect.out")"
        echo "nat-test: a relay that terminates TLS is refused: $(head -n 1 "$T/mitm-connect.out")"
    fi
    for p in "${PIDS[@]}"; do kill9 "$p"; done
    PIDS=()
}

round cone "" yes
round symmetric "--random-fully" no
echo "nat-test: OK"
