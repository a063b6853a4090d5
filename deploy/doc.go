// Package deploy holds what an operator installs beside the drover binary:
// the container image definition (container/), the systemd unit (systemd/),
// the packages' configuration file and maintainer scripts (package/, built
// into the .deb and .rpm by internal/release), Prometheus alerting rules
// (prometheus/), a Grafana dashboard (grafana/), HAProxy in front of a
// cluster (haproxy/) and the whole cluster with Compose (compose/). Its
// tests check them: the rules with promtool, the unit with systemd-analyze,
// the image by building it (podman) or statically, HAProxy's configuration
// with haproxy -c, the Compose file against HAProxy's backends, the image
// and drover serve's flags, and that every metric the rules and the
// dashboard use is one the server exports.
package deploy
