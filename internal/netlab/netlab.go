// Package netlab builds small labs of "machines" on one Linux machine for
// tests: every host is a network namespace with one veth on a bridge in the
// root namespace, which holds the bridge's address (.1). Tests that need
// several machines (internal/clustertest's cluster, internal/perf's load
// machines) use it; it needs root and iproute2 (Prerequisites says what is
// missing, and the tests skip on it).
package netlab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Sbin is the path of an administration program (PATH, else /usr/sbin).
func Sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

// Prerequisites names what is missing for a lab with the given programs
// besides ip ("" when nothing).
func Prerequisites(programs ...string) string {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "not root (network namespaces need it)")
	}
	for _, bin := range append([]string{"ip"}, programs...) {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + bin); err != nil {
				miss = append(miss, bin+" not installed")
			}
		}
	}
	return strings.Join(miss, "; ")
}

// IP runs ip with args.
func IP(args ...string) error {
	out, err := exec.Command(Sbin("ip"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// CleanStale removes the namespaces, veths and bridges of earlier labs
// whose names start with prefix followed by the id of a process that is
// gone (a run killed before its cleanup). IDs made by NewID have this form.
func CleanStale(prefix string) {
	p := regexp.QuoteMeta(prefix)
	for _, c := range []struct {
		list, del []string
		re        *regexp.Regexp
	}{
		{[]string{"netns", "list"}, []string{"netns", "del"}, regexp.MustCompile(`(?m)^(` + p + `(\d+)[a-z]-\S+)`)},
		{[]string{"-o", "link"}, []string{"link", "del"}, regexp.MustCompile(`(?m)^\d+: (` + p + `(\d+)[a-z][bh]\d*)[@:]`)},
	} {
		out, _ := exec.Command(Sbin("ip"), c.list...).Output()
		for _, m := range c.re.FindAllStringSubmatch(string(out), -1) {
			if pid, _ := strconv.Atoi(m[2]); syscall.Kill(pid, 0) == syscall.ESRCH {
				exec.Command(Sbin("ip"), append(c.del, m[1])...).Run()
			}
		}
	}
}

// NewID is a lab id: prefix, this process's id and a letter (seq). Keep
// prefix at 3 characters: link names are the id plus 3 and must fit in 15.
func NewID(prefix string, seq int) string {
	return fmt.Sprintf("%s%d%c", prefix, os.Getpid(), 'a'+seq%26)
}

// FreeSubnet picks a 10.x.y.0/24 no interface of this machine is on, as
// "10.x.y".
func FreeSubnet(seed int) string {
	out, _ := exec.Command(Sbin("ip"), "-4", "-o", "addr").Output()
	for i := 0; ; i++ {
		n := fmt.Sprintf("10.%d.%d", 200+(seed+i)%50, (seed/50+i)%250)
		if !bytes.Contains(out, []byte(" "+n+".")) {
			return n
		}
	}
}

// Host is one network namespace.
type Host struct {
	NS   string // namespace name
	Veth string // its veth's end on the bridge (root namespace)
	IP   string
}

// Exec is the command prefix that runs a program on h.
func (h *Host) Exec() []string { return []string{Sbin("ip"), "netns", "exec", h.NS} }

// Command is a command running name with args on h.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	all := append(h.Exec(), name)
	return exec.Command(all[0], append(all[1:], args...)...)
}

// Bytes is what h's veth carried in both directions.
func (h *Host) Bytes() int64 {
	var n int64
	for _, f := range []string{"rx_bytes", "tx_bytes"} {
		b, _ := os.ReadFile("/sys/class/net/" + h.Veth + "/statistics/" + f)
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		n += v
	}
	return n
}

// Net is a bridge and its hosts.
type Net struct {
	ID     string // prefix of every namespace and link
	Subnet string // the /24, as "10.X.Y"
	HostIP string // the bridge's address in the root namespace
	mu     sync.Mutex
	hosts  []*Host
	undo   []func()
}

// New makes the bridge <id>b with address <subnet>.1/24 (subnet "": a free
// one). Close removes it and every host.
func New(id, subnet string) (*Net, error) {
	if subnet == "" {
		subnet = FreeSubnet(os.Getpid())
	}
	n := &Net{ID: id, Subnet: subnet, HostIP: subnet + ".1"}
	br := id + "b"
	n.undo = append(n.undo, func() { exec.Command(Sbin("ip"), "link", "del", br).Run() })
	for _, args := range [][]string{
		{"link", "add", br, "type", "bridge"},
		{"addr", "add", n.HostIP + "/24", "dev", br},
		{"link", "set", br, "up"},
	} {
		if err := IP(args...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Hosts is how many hosts were added.
func (n *Net) Hosts() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.hosts)
}

// AddHost makes namespace <id>-<name> with address <subnet>.<octet> and a
// default route through the bridge.
func (n *Net) AddHost(name string, octet int) (*Host, error) {
	n.mu.Lock()
	i := len(n.hosts) + 1
	h := &Host{NS: n.ID + "-" + name, Veth: fmt.Sprintf("%sh%d", n.ID, i), IP: fmt.Sprintf("%s.%d", n.Subnet, octet)}
	n.hosts = append(n.hosts, h)
	n.undo = append(n.undo, func() {
		exec.Command(Sbin("ip"), "link", "del", h.Veth).Run() // both ends
		exec.Command(Sbin("ip"), "netns", "del", h.NS).Run()
	})
	n.mu.Unlock()
	peer := fmt.Sprintf("%sp%d", n.ID, i)
	for _, args := range [][]string{
		{"netns", "add", h.NS},
		{"link", "add", h.Veth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", h.NS},
		{"link", "set", h.Veth, "master", n.ID + "b", "up"},
		{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", peer},
		{"-n", h.NS, "link", "set", peer, "up"},
		{"-n", h.NS, "link", "set", "lo", "up"},
		{"-n", h.NS, "route", "add", "default", "via", n.HostIP},
	} {
		if err := IP(args...); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Close removes the hosts and the bridge (last made, first removed).
func (n *Net) Close() {
	n.mu.Lock()
	undo := n.undo
	n.undo = nil
	n.mu.Unlock()
	for i := len(undo) - 1; i >= 0; i-- {
		undo[i]()
	}
}

// WaitTCP waits until addr accepts a connection, at most limit.
func WaitTCP(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AddLAN makes namespace <id>-<name>, a host on a LAN of its own behind
// router: a veth pair between the two namespaces, <subnet>.1/24 on the
// router's end and <subnet>.<octet>/24 on the host's, whose default route
// is the router. Nothing else reaches the host (subnet "": a free one).
func (n *Net) AddLAN(router *Host, name, subnet string, octet int) (*Host, error) {
	if subnet == "" {
		subnet = FreeSubnet(os.Getpid() + 97)
	}
	n.mu.Lock()
	i := len(n.hosts) + 1
	h := &Host{NS: n.ID + "-" + name, Veth: fmt.Sprintf("%sl%d", n.ID, i), IP: fmt.Sprintf("%s.%d", subnet, octet)}
	n.hosts = append(n.hosts, h)
	n.undo = append(n.undo, func() {
		exec.Command(Sbin("ip"), "-n", router.NS, "link", "del", h.Veth).Run() // both ends
		exec.Command(Sbin("ip"), "netns", "del", h.NS).Run()
	})
	n.mu.Unlock()
	peer := fmt.Sprintf("%sq%d", n.ID, i)
	for _, args := range [][]string{
		{"netns", "add", h.NS},
		{"-n", router.NS, "link", "add", h.Veth, "type", "veth", "peer", "name", peer, "netns", h.NS},
		{"-n", router.NS, "addr", "add", subnet + ".1/24", "dev", h.Veth},
		{"-n", router.NS, "link", "set", h.Veth, "up"},
		{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", peer},
		{"-n", h.NS, "link", "set", peer, "up"},
		{"-n", h.NS, "link", "set", "lo", "up"},
		{"-n", h.NS, "route", "add", "default", "via", subnet + ".1"},
	} {
		if err := IP(args...); err != nil {
			return nil, err
		}
	}
	return h, nil
}
