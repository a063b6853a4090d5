package release

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testwait"
)

// installPrerequisites says why this machine cannot take the .deb, or "".
func installPrerequisites() string {
	if os.Geteuid() != 0 {
		return "not root: dpkg -i needs root"
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "dpkg-statoverride", "deb-systemd-helper", "setpriv", "useradd", "userdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "no " + tool + " (a Debian system with dpkg, init-system-helpers, util-linux, passwd)"
		}
	}
	// An installation of the operator's is never touched.
	if err := exec.Command("dpkg-query", "-W", "drover").Run(); err == nil {
		return "a drover package is installed on this machine"
	}
	if _, err := user.Lookup(User); err == nil {
		return "a user drover exists on this machine"
	}
	for _, p := range []string{DataDir, ConfigDir} {
		if _, err := os.Stat(p); err == nil {
			return p + " exists on this machine"
		}
	}
	return ""
}

// unitSettings reads the [Service] settings of a unit file: key to values.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "[") {
			section = l
			continue
		}
		if k, v, ok := strings.Cut(l, "="); ok && section == "[Service]" && !strings.HasPrefix(l, "#") {
			out[k] = append(out[k], v)
		}
	}
	return out
}

// TestDebInstallServePurge installs the .deb of a real drover with dpkg,
// checks what postinst made, runs the server from the installed files as
// its unit would (as the user drover, with the unit's environment and
// umask; this machine's systemd need not run), asks /healthz over TLS
// with the certificate the server generated, and purges the package.
func TestDebInstallServePurge(t *testing.T) {
	if why := installPrerequisites(); why != "" {
		t.Skip(why)
	}
	start := time.Now()
	dir := t.TempDir()
	bin := filepath.Join(dir, "drover")
	// Built as cmd/drover's tests build it, so that the build cache serves
	// every compiled package (the release's static build is
	// scripts/release.sh's; the package does not care).
	build := exec.Command("go", "build", "-o", bin, "../../cmd/drover")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	built := time.Since(start)
	cfg := DefaultConfig()
	cfg.Binary, cfg.Arch, cfg.Version, cfg.Root, cfg.OutDir, cfg.Formats, cfg.Compression = bin, runtime.GOARCH, "v0.0.0-20261127221520-7cff1a945eb0", "../..", dir, []string{"deb"}, "gzip:1"
	paths, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deb := paths[0]
	packaged := time.Since(start) - built

	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// dpkg, waiting while another dpkg or apt holds its lock.
	dpkg := func(args ...string) string {
		t.Helper()
		var out []byte
		var err error
		testwait.For(t, 2*time.Minute, "dpkg's lock", func() bool {
			out, err = exec.Command("dpkg", args...).CombinedOutput()
			return err == nil || !strings.Contains(string(out), "lock")
		})
		if err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	purged := false
	t.Cleanup(func() {
		if !purged {
			exec.Command("dpkg", "--purge", "drover").Run()
		}
		os.RemoveAll(DataDir)
		exec.Command("userdel", User).Run()
		exec.Command("groupdel", User).Run()
	})
	out := dpkg("-i", deb)
	if !strings.Contains(out, "systemctl enable --now drover") {
		t.Errorf("postinst did not say how to start the server:\n%s", out)
	}

	// postinst: the user, the data directory, the configuration's owner.
	u, err := user.Lookup(User)
	if err != nil {
		t.Fatalf("postinst made no user drover: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if g, err := user.LookupGroupId(u.Gid); err != nil || g.Name != User {
		t.Errorf("user drover's group: %v %v", g, err)
	}
	if uid == 0 || uid >= 1000 {
		t.Errorf("user drover has uid %d, not a system user's", uid)
	}
	for path, want := range map[string]struct {
		mode     os.FileMode
		uid, gid int
	}{
		DataDir:     {os.ModeDir | 0o700, uid, gid},
		ConfigDir:   {os.ModeDir | 0o750, 0, gid},
		ConfigFile:  {0o640, 0, gid},
		BinaryPath:  {0o755, 0, 0},
		ServiceUnit: {0o644, 0, 0},
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("after dpkg -i: %v", err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != want.mode || int(st.Uid) != want.uid || int(st.Gid) != want.gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", path, fi.Mode(), st.Uid, st.Gid, want.mode, want.uid, want.gid)
		}
	}
	if out := run("dpkg-query", "-W", "-f", "${Conffiles}", "drover"); !strings.Contains(out, ConfigFile) {
		t.Errorf("dpkg does not know %s as a conffile: %q", ConfigFile, out)
	}
	// Nothing enabled by the package itself.
	for _, link := range []string{"/etc/systemd/system/multi-user.target.wants/drover.service", "/etc/systemd/system/sockets.target.wants/drover.socket"} {
		if _, err := os.Lstat(link); err == nil {
			t.Errorf("the package enabled a unit: %s", link)
		}
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		if out, err := exec.Command(analyze, "verify", ServiceUnit, SocketUnit).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify of the installed units: %v\n%s", err, out)
		}
		if out, err := exec.Command(analyze, "security", "--offline=true", "--threshold=20", ServiceUnit).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze security of the installed unit: %v\n%s", err, out)
		}
	}

	// The server, as the unit starts it.
	unit := unitSettings(t, ServiceUnit)
	if got := strings.Join(unit["User"], " ") + ":" + strings.Join(unit["Group"], " "); got != "drover:drover" {
		t.Fatalf("unit User:Group %s", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG=C.UTF-8", "HOME=" + DataDir}
	env = append(env, unit["Environment"]...)
	// As a line of /etc/drover/drover.env would: this machine's port 8443 may be taken.
	env = append(env, "DROVER_LISTEN="+addr)
	umask := strings.Join(unit["UMask"], "")
	execStart := strings.Fields(strings.Join(unit["ExecStart"], ""))
	if umask == "" || len(execStart) < 2 || execStart[0] != BinaryPath {
		t.Fatalf("unit UMask %q ExecStart %q", umask, execStart)
	}
	args := append([]string{"-c", `umask "$0" && exec setpriv --reuid=drover --regid=drover --init-groups --no-new-privs -- "$@"`, umask}, execStart...)
	srv := exec.Command("sh", args...)
	srv.Dir = "/"
	srv.Env = env
	var log testwait.Buffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			srv.Process.Kill()
			<-exited
		}
	}()
	certPath := filepath.Join(DataDir, "tls", "cert.pem")
	var client *http.Client
	testwait.For(t, 30*time.Second, "the installed server to answer /healthz over TLS", func() bool {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("drover serve exited: %v\n%s", err, log.String())
		default:
		}
		if client == nil {
			pem, err := os.ReadFile(certPath)
			if err != nil {
				return false
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return false
			}
			client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		}
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// Ready (the fleet loaded) before it is stopped, as an admin would see it.
	testwait.For(t, 30*time.Second, "the installed server to be ready (/readyz)", func() bool {
		resp, err := client.Get("https://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	served := time.Since(start) - built - packaged
	// What the server wrote belongs to drover, private.
	for _, p := range []string{filepath.Join(DataDir, "secrets.json"), filepath.Join(DataDir, "drover.db"), filepath.Join(DataDir, "tls", "key.pem")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("the server did not write %s: %v", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v uid %d, want drover's (%d) and private", p, fi.Mode(), st.Uid, uid)
		}
	}
	// The notice follows the listener: the server may answer first.
	if !testwait.Until(10*time.Second, func() bool { return strings.Contains(log.String(), "generated credentials") }) {
		t.Errorf("the first start printed no generated credentials:\n%s", log.String())
	}
	// systemctl stop: SIGTERM, a clean exit.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	srv.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("drover serve after SIGTERM: %v\n%s", err, log.String())
		}
	case <-ctx.Done():
		t.Fatalf("drover serve did not stop within the unit's TimeoutStopSec\n%s", log.String())
	}

	dpkg("--purge", "drover")
	purged = true
	for _, gone := range []string{BinaryPath, ServiceUnit, SocketUnit, ConfigFile, ConfigDir, DocFile} {
		if _, err := os.Lstat(gone); err == nil {
			t.Errorf("%s is left after dpkg --purge", gone)
		}
	}
	if out, err := exec.Command("dpkg-statoverride", "--list", ConfigDir).CombinedOutput(); err == nil {
		t.Errorf("dpkg-statoverride still lists %s: %s", ConfigDir, out)
	}
	if m, _ := filepath.Glob("/var/lib/systemd/deb-systemd-helper-*/*drover*"); len(m) > 0 {
		t.Errorf("deb-systemd-helper state left after purge: %v", m)
	}
	// The data stays (a database is not the package's to delete).
	if _, err := os.Stat(filepath.Join(DataDir, "drover.db")); err != nil {
		t.Errorf("purge removed the data: %v", err)
	}
	t.Logf("go build %v, package %v, install and first answer %v, in all %v", built.Round(time.Millisecond), packaged.Round(time.Millisecond),
		served.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
