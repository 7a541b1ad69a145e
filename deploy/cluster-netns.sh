#!/usr/bin/env bash
# N "hosts" on one machine: Linux network namespaces joined by veth pairs to a bridge, a
# streamnet-worker in each, ZooKeeper on the bridge address. Cut a host off the network and
# heal it to test partitions. Needs root and iproute2. Addresses: 10.77.0.1 (this machine, on
# the bridge), 10.77.0.(10+I) for host I - private addresses that exist only inside this machine.
#
#   deploy/cluster-netns.sh up N [--secret-file F] [--cluster NAME] [--threads T] [--zk-port P]
#   deploy/cluster-netns.sh cut I      # host I loses its network (its link goes down)
#   deploy/cluster-netns.sh heal I
#   deploy/cluster-netns.sh status
#   deploy/cluster-netns.sh down       # workers, namespaces, bridge and ZooKeeper go away
set -euo pipefail
cmd=${1:-}; shift || true
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here")
run=${STREAMNET_NETNS_DIR:-$root/.run/netns}
bridge=snbr0; prefix=10.77.0; zkport=2281; cluster=netns; threads=1; secret=""
n=0
if [ "$cmd" = up ]; then n=${1:?usage: up N}; shift; fi
if [ "$cmd" = cut ] || [ "$cmd" = heal ]; then host=${1:?usage: $cmd I}; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --secret-file) secret=$2; shift 2;;
    --cluster) cluster=$2; shift 2;;
    --threads) threads=$2; shift 2;;
    --zk-port) zkport=$2; shift 2;;
    *) echo "cluster-netns.sh: unknown option $1" >&2; exit 2;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "cluster-netns.sh: needs root (network namespaces)" >&2; exit 1; }
py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3

case "$cmd" in
  up)
    mkdir -p "$run"
    if [ -z "$secret" ]; then secret="$run/secret"; ( umask 077; head -c 32 /dev/urandom | base64 > "$secret" ); fi
    ip link add "$bridge" type bridge 2>/dev/null || true
    ip addr add "$prefix.1/24" dev "$bridge" 2>/dev/null || true
    ip link set "$bridge" up
    "$here/zookeeper.sh" start --dir "$run/zookeeper" --port "$zkport" --bind "$prefix.1" >/dev/null
    for i in $(seq 1 "$n"); do
      ns=sn$i
      ip netns add "$ns"
      ip link add "snv$i" type veth peer name eth0 netns "$ns"
      ip link set "snv$i" master "$bridge" up
      ip -n "$ns" addr add "$prefix.$((10 + i))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      ip netns exec "$ns" setsid "$py" -m streamnet.cli.worker --zk "$prefix.1:$zkport" --cluster "$cluster" \
        --secret-file "$secret" --host "$prefix.$((10 + i))" --port 7700 --threads "$threads" --name "host$i" \
        > "$run/host$i.log" 2>&1 < /dev/null &
      echo $! > "$run/host$i.pid"
    done
    echo "$n" > "$run/hosts"
    echo "ZooKeeper: $prefix.1:$zkport  cluster: $cluster  secret: $secret"
    echo "submit with: streamnet-submit status --zk $prefix.1:$zkport --cluster $cluster --secret-file $secret";;
  cut)  ip link set "snv$host" down; echo "host$host cut off";;
  heal) ip link set "snv$host" up; echo "host$host healed";;
  status)
    for i in $(seq 1 "$(cat "$run/hosts" 2>/dev/null || echo 0)"); do
      state=$(cat "/sys/class/net/snv$i/operstate" 2>/dev/null || echo gone)
      pid=$(cat "$run/host$i.pid" 2>/dev/null || echo 0)
      alive=$(kill -0 "$pid" 2>/dev/null && echo running || echo stopped)
      echo "host$i $prefix.$((10 + i)) link $state worker $alive"
    done;;
  down)
    for i in $(seq 1 "$(cat "$run/hosts" 2>/dev/null || echo 0)"); do
      pid=$(cat "$run/host$i.pid" 2>/dev/null || echo 0)
      kill "$pid" 2>/dev/null || true
    done
    sleep 1
    for i in $(seq 1 "$(cat "$run/hosts" 2>/dev/null || echo 0)"); do
      pid=$(cat "$run/host$i.pid" 2>/dev/null || echo 0); kill -9 "$pid" 2>/dev/null || true
      ip netns del "sn$i" 2>/dev/null || true
      ip link del "snv$i" 2>/dev/null || true
    done
    "$here/zookeeper.sh" stop --dir "$run/zookeeper" || true
    ip link del "$bridge" 2>/dev/null || true
    rm -rf "$run";;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2;;
esac
