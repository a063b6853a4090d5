// Package deploy holds what an operator installs beside the drover binary:
// the container image definition (container/), the systemd unit (systemd/),
// Prometheus alerting rules (prometheus/) and a Grafana dashboard
// (grafana/). Its tests check them: the rules with promtool, the unit with
// systemd-analyze, the image by building it (podman) or statically, and
// that every metric the rules and the dashboard use is one the server
// exports.
package deploy
