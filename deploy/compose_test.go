package deploy

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is what TestComposeFile reads of compose/compose.yaml.
type composeFile struct {
	Services map[string]composeService
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet  string
				IPRange string `yaml:"ip_range"`
			}
		}
	}
	Volumes map[string]any
	Secrets map[string]struct{ File string }
}

type composeService struct {
	Image string
	Build *struct {
		Context, Dockerfile string
	}
	Command     []string
	Environment map[string]string
	Volumes     []string
	Ports       []string
	Secrets     []string
	DependsOn   map[string]struct{ Condition string } `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string
	}
	StopGracePeriod string `yaml:"stop_grace_period"`
	Networks        map[string]struct {
		IPv4Address string `yaml:"ipv4_address"`
	}
}

// serveFlags lists drover serve's flags as cmd/drover/serve.go defines them.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../cmd/drover/serve.go")
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{"config": true}
	for _, m := range regexp.MustCompile(`fs\.\w+Var\(&[^,]+, "([a-z0-9-]+)"`).FindAllStringSubmatch(string(b), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 40 || !flags["cluster"] || !flags["nats-url"] {
		t.Fatalf("read %d flags of drover serve from cmd/drover/serve.go: %v", len(flags), flags)
	}
	return flags
}

// haproxyServers reads the server lines of each backend of drover.cfg.
func haproxyServers(t *testing.T) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile("haproxy/drover.cfg")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	backend := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case f[0] == "backend" && len(f) == 2:
			backend = f[1]
			out[backend] = map[string]string{}
		case f[0] == "frontend" || f[0] == "global" || f[0] == "defaults":
			backend = ""
		case f[0] == "server" && backend != "" && len(f) >= 3:
			out[backend][f[1]] = f[2]
		}
	}
	return out
}

// TestComposeFile: compose/compose.yaml is a consistent cluster.
// HAProxy runs deploy/haproxy/drover.cfg, whose every backend server is a
// node of the file at that address and port; the nodes run the image of
// deploy/container with its health check and data volume, as cluster nodes
// of the one PostgreSQL and NATS (both checked healthy before the nodes
// start), with settings that are drover serve's flags and secrets the
// file declares; every volume and secret is declared and used; docs/cluster.md
// shows how to run it. With docker compose or podman-compose on PATH, the tool
// checks the file too.
func TestComposeFile(t *testing.T) {
	raw, err := os.ReadFile("compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Compose's interpolation, each variable given a value of its name.
	raw = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}`).ReplaceAll(raw, []byte("value-of-$1"))
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range c.Services {
			if !yield(n) {
				return
			}
		}
	})
	if want := []string{"haproxy", "nats", "node1", "node2", "node3", "postgres"}; !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	flags := serveFlags(t)
	lines := containerfile(t)

	// The network: fixed addresses inside the subnet, outside the range
	// handed out to the others.
	if len(c.Networks) != 1 || len(c.Networks["drover"].IPAM.Config) != 1 {
		t.Fatalf("networks %+v, want one, drover, with one subnet", c.Networks)
	}
	ipam := c.Networks["drover"].IPAM.Config[0]
	_, subnet, err := net.ParseCIDR(ipam.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	_, dynamic, err := net.ParseCIDR(ipam.IPRange)
	if err != nil {
		t.Fatal(err)
	}
	address := func(name string) string {
		a := c.Services[name].Networks["drover"].IPv4Address
		ip := net.ParseIP(a)
		if ip == nil || !subnet.Contains(ip) || dynamic.Contains(ip) {
			t.Errorf("%s: address %q is not a fixed one of %s outside %s", name, a, subnet, dynamic)
		}
		return a
	}

	// HAProxy: the file as it is, its port published, every backend server a node.
	h := c.Services["haproxy"]
	if !slices.Contains(h.Volumes, "../haproxy/drover.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro") {
		t.Errorf("haproxy does not mount deploy/haproxy/drover.cfg as its configuration: %v", h.Volumes)
	}
	cfg, _ := os.ReadFile("haproxy/drover.cfg")
	if !strings.Contains(string(cfg), "bind :8443") || !slices.Contains(h.Ports, "8443:8443") {
		t.Errorf("haproxy publishes %v; drover.cfg binds :8443", h.Ports)
	}
	haproxyAddr := address("haproxy")
	servers := haproxyServers(t)
	if len(servers) != 2 {
		t.Fatalf("drover.cfg backends %v", servers)
	}
	nodes := map[string]bool{}
	for backend, ss := range servers {
		for name, hostport := range ss {
			host, port, err := net.SplitHostPort(hostport)
			if err != nil {
				t.Fatalf("drover.cfg %s: server %s %s: %v", backend, name, hostport, err)
			}
			n, ok := c.Services[name]
			if !ok {
				t.Errorf("drover.cfg %s: server %s is no service of compose.yaml", backend, name)
				continue
			}
			nodes[name] = true
			if a := address(name); a != host {
				t.Errorf("drover.cfg %s: server %s at %s; compose.yaml gives it %s", backend, name, host, a)
			}
			if _, lport, _ := net.SplitHostPort(n.Environment["DROVER_LISTEN"]); lport != port {
				t.Errorf("%s listens on %q; drover.cfg %s reaches it on port %s", name, n.Environment["DROVER_LISTEN"], backend, port)
			}
			if h.DependsOn[name].Condition == "" {
				t.Errorf("haproxy does not depend on %s", name)
			}
		}
	}
	if len(nodes) != 3 {
		t.Errorf("drover.cfg names nodes %v, want the file's three", nodes)
	}

	// PostgreSQL and NATS: healthy before the nodes start.
	pg := c.Services["postgres"]
	nats := c.Services["nats"]
	if !slices.Contains(nats.Command, "--jetstream") {
		t.Errorf("nats command %v lacks --jetstream", nats.Command)
	}

	// The nodes.
	volumes := map[string]bool{}
	secrets := map[string]bool{}
	nodeNames := map[string]bool{}
	var image string
	for name := range nodes {
		n := c.Services[name]
		env := n.Environment
		if image == "" {
			image = n.Image
		}
		if n.Image != image || image == "" {
			t.Errorf("%s runs image %q, the others %q", name, n.Image, image)
		}
		if env["DROVER_CLUSTER"] != "true" {
			t.Errorf("%s: DROVER_CLUSTER=%q", name, env["DROVER_CLUSTER"])
		}
		if env["DROVER_NODE_NAME"] != name || nodeNames[env["DROVER_NODE_NAME"]] {
			t.Errorf("%s: node name %q, want its service name, unique", name, env["DROVER_NODE_NAME"])
		}
		nodeNames[env["DROVER_NODE_NAME"]] = true
		db, err := url.Parse(env["DROVER_DB"])
		if err != nil || db.Scheme != "postgres" || db.Hostname() != "postgres" || db.User.Username() != pg.Environment["POSTGRES_USER"] ||
			strings.TrimPrefix(db.Path, "/") != pg.Environment["POSTGRES_DB"] {
			t.Errorf("%s: DROVER_DB %q is not the postgres service's database (%v)", name, env["DROVER_DB"], err)
		}
		if pw, _ := db.User.Password(); err == nil && pw != pg.Environment["POSTGRES_PASSWORD"] {
			t.Errorf("%s: DROVER_DB's password %q, postgres has %q", name, pw, pg.Environment["POSTGRES_PASSWORD"])
		}
		if env["DROVER_NATS_URL"] != "nats://nats:4222" {
			t.Errorf("%s: DROVER_NATS_URL %q, want the nats service", name, env["DROVER_NATS_URL"])
		}
		if env["DROVER_REGISTER_RATE_EXEMPT"] != haproxyAddr {
			t.Errorf("%s: DROVER_REGISTER_RATE_EXEMPT %q; HAProxy's address is %s", name, env["DROVER_REGISTER_RATE_EXEMPT"], haproxyAddr)
		}
		for _, dep := range []string{"postgres", "nats"} {
			if n.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s: depends_on %s %+v, want condition service_healthy", name, dep, n.DependsOn[dep])
			}
		}
		for k, v := range env {
			flag, ok := strings.CutPrefix(k, "DROVER_")
			flag = strings.ToLower(strings.ReplaceAll(flag, "_", "-"))
			if !ok || !flags[flag] {
				t.Errorf("%s: %s is no flag of drover serve", name, k)
			}
			if secret, ok := strings.CutPrefix(v, "/run/secrets/"); ok {
				if !slices.Contains(n.Secrets, secret) {
					t.Errorf("%s: %s=%s, a secret it does not mount", name, k, v)
				}
				secrets[secret] = true
			}
		}
		// The image's health check, stop time and data volume.
		if n.Healthcheck == nil || !slices.Contains(lines, `HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 CMD ["`+strings.Join(n.Healthcheck.Test[1:], `", "`)+`"]`) {
			t.Errorf("%s: health check %+v is not the Containerfile's", name, n.Healthcheck)
		}
		if n.StopGracePeriod != "45s" {
			t.Errorf("%s: stop_grace_period %q, want 45s (docs/operations.md#container)", name, n.StopGracePeriod)
		}
		if len(n.Volumes) != 1 || !strings.HasSuffix(n.Volumes[0], ":/var/lib/drover") || volumes[n.Volumes[0]] {
			t.Errorf("%s: volumes %v, want a data volume of its own at /var/lib/drover", name, n.Volumes)
		} else {
			volumes[n.Volumes[0]] = true
		}
	}
	builds := 0
	for name := range nodes {
		if b := c.Services[name].Build; b != nil {
			builds++
			if b.Context != "../../dist/container" || b.Dockerfile != "Containerfile" {
				t.Errorf("%s: build %+v, want scripts/release.sh's context ../../dist/container", name, b)
			}
		}
	}
	if builds != 1 {
		t.Errorf("%d nodes build the image, want one", builds)
	}

	// Every service has a health check; every volume and secret is
	// declared and used.
	used := map[string]bool{}
	for name, s := range c.Services {
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD" {
			t.Errorf("%s: no health check", name)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") {
				used[src] = true
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("%s: volume %s is not declared", name, src)
				}
			}
		}
		for _, sec := range s.Secrets {
			if c.Secrets[sec].File == "" {
				t.Errorf("%s: secret %s is not declared with a file", name, sec)
			}
		}
	}
	for v := range c.Volumes {
		if !used[v] {
			t.Errorf("volume %s is declared and not used", v)
		}
	}
	for s := range c.Secrets {
		if !secrets[s] {
			t.Errorf("secret %s is declared and not used", s)
		}
	}

	// docs/cluster.md says how to run it, with the secrets' file names.
	doc, err := os.ReadFile("../docs/cluster.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"deploy/compose/compose.yaml", "DROVER_DB_PASSWORD"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/cluster.md does not mention %s", want)
		}
	}
	for name, s := range c.Secrets {
		if !strings.Contains(string(doc), strings.TrimPrefix(s.File, "./")) {
			t.Errorf("docs/cluster.md does not say how to make secret %s (%s)", name, s.File)
		}
	}

	// The compose tool's own check, where there is one.
	var tool []string
	if out, err := exec.Command("docker", "compose", "version").CombinedOutput(); err == nil && strings.Contains(string(out), "version") {
		tool = []string{"docker", "compose"}
	} else if p, err := exec.LookPath("podman-compose"); err == nil {
		tool = []string{p}
	}
	if tool == nil {
		t.Log("no docker compose or podman-compose: the file is checked structurally only")
		return
	}
	dir := t.TempDir()
	for _, s := range c.Secrets {
		p := filepath.Join(dir, s.File)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("x\n"), 0o600)
	}
	b, _ := os.ReadFile("compose/compose.yaml")
	// The relative paths (the HAProxy configuration, the build context) from a copy's directory.
	abs, _ := filepath.Abs(".")
	b = []byte(strings.NewReplacer("../haproxy/", abs+"/haproxy/", "../../dist/", filepath.Dir(abs)+"/dist/").Replace(string(b)))
	os.WriteFile(filepath.Join(dir, "compose.yaml"), b, 0o644)
	cmd := exec.Command(tool[0], append(tool[1:], "-f", filepath.Join(dir, "compose.yaml"), "config")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DROVER_DB_PASSWORD=test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s config: %v\n%s", strings.Join(tool, " "), err, out)
	}
}
