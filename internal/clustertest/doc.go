// Package clustertest runs Drover as it is deployed in cluster mode:
// `drover serve` nodes as separate hosts (network namespaces on a bridge),
// PostgreSQL and NATS on hosts of their own, HAProxy in front with the
// configuration of deploy/haproxy/drover.cfg, and `drover emulate` driving
// a fleet through it. The tests kill a node, pause NATS and restart
// PostgreSQL under load and check every answer against the database; the
// measurement (scripts/bench-cluster.sh) reports CPU, bytes and database
// cost per push with 1, 2 and 3 nodes. See docs/cluster.md.
//
// It needs root, ip(8), haproxy and nats-server (scripts/test.sh installs
// them); without them the tests skip, saying what is missing.
package clustertest
