package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/blakesmith/ar"
	rpmutils "github.com/sassoftware/go-rpmutils"
)

func TestPackageVersion(t *testing.T) {
	for in, want := range map[string][3]string{
		"v1.2.0":                                   {"1.2.0", "", ""},
		"v1.2.0+dirty":                             {"1.2.0", "", "dirty"},
		"v1.2.0-rc.1":                              {"1.2.0", "rc.1", ""},
		"v1.2.0-3-gabc1234":                        {"1.2.0", "", "3.gabc1234"},
		"v1.2.0-3-gabc1234+dirty":                  {"1.2.0", "", "3.gabc1234.dirty"},
		"v0.0.0-20261127221520-7cff1a945eb0":       {"0.0.0", "20261127221520.7cff1a945eb0", ""},
		"v0.0.0-20261127221520-7cff1a945eb0+dirty": {"0.0.0", "20261127221520.7cff1a945eb0", "dirty"},
	} {
		v, pre, meta, err := PackageVersion(in)
		if err != nil || [3]string{v, pre, meta} != want {
			t.Errorf("PackageVersion(%q) = %q %q %q, %v; want %q", in, v, pre, meta, err, want)
		}
	}
	for _, bad := range []string{"", "1.2", "vX", "v1.2.0-", "v1.2.0 -x", "v1.2.0-3-g"} {
		if _, _, _, err := PackageVersion(bad); err == nil {
			t.Errorf("PackageVersion(%q) accepted", bad)
		}
	}
}

// The versions sort as dpkg sorts them: pseudo-versions by time before
// the first tag, pre-releases before their release, commits past a tag
// after it.
func TestPackageVersionOrder(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg (Debian: dpkg)")
	}
	ordered := []string{
		"v0.0.0-20261127221520-7cff1a945eb0",
		"v0.0.0-20261128000000-000000000000",
		"v1.2.0-rc.1",
		"v1.2.0",
		"v1.2.0-3-gabc1234",
		"v1.2.1",
	}
	debVersion := func(v string) string {
		ver, pre, meta, err := PackageVersion(v)
		if err != nil {
			t.Fatal(err)
		}
		if pre != "" {
			ver += "~" + pre
		}
		if meta != "" {
			ver += "+" + meta
		}
		return ver
	}
	for i := 1; i < len(ordered); i++ {
		a, b := debVersion(ordered[i-1]), debVersion(ordered[i])
		if err := exec.Command("dpkg", "--compare-versions", a, "lt", b).Run(); err != nil {
			t.Errorf("dpkg: %s (%s) is not before %s (%s)", a, ordered[i-1], b, ordered[i])
		}
	}
}

// The packaged service differs from deploy/systemd's only where the
// package needs it; a unit that lost a line the package edits is refused.
func TestPackagedUnit(t *testing.T) {
	src, err := os.ReadFile("../../deploy/systemd/drover.service")
	if err != nil {
		t.Fatal(err)
	}
	unit, err := PackagedUnit("drover.service", src)
	if err != nil {
		t.Fatal(err)
	}
	u := string(unit)
	for _, want := range []string{"\nExecStart=/usr/bin/drover serve\n", "\nUser=drover\nGroup=drover\n", "\nEnvironment=DROVER_CONFIG=/etc/drover/drover.toml\n",
		"\nEnvironmentFile=-/etc/drover/drover.env\n", "\nStateDirectory=drover\n", "\nNoNewPrivileges=yes\n", "\nProtectSystem=strict\n", "systemctl edit drover`"} {
		if !strings.Contains(u, want) {
			t.Errorf("packaged unit lacks %q", strings.TrimSpace(want))
		}
	}
	for _, gone := range []string{"DynamicUser", "/usr/local/bin", "install -m"} {
		if strings.Contains(u, gone) {
			t.Errorf("packaged unit still has %q", gone)
		}
	}
	// Apart from the header and the three edits, line for line the same.
	body := func(b string) []string {
		var out []string
		for _, l := range strings.Split(b, "\n") {
			if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "ExecStart=") && !strings.HasPrefix(l, "DynamicUser=") &&
				!strings.HasPrefix(l, "User=") && !strings.HasPrefix(l, "Group=") && l != "Environment=DROVER_CONFIG=/etc/drover/drover.toml" {
				out = append(out, l)
			}
		}
		return out
	}
	if !slices.Equal(body(string(src)), body(u)) {
		t.Errorf("packaged unit differs beyond its edits:\n%s", u)
	}
	if _, err := PackagedUnit("drover.service", bytes.ReplaceAll(src, []byte("DynamicUser=yes\n"), nil)); err == nil {
		t.Error("a unit without DynamicUser=yes was adapted silently")
	}
}

// files lists a package's entries: path (directories with a trailing
// slash) to mode, owner and group, and whether it is a configuration file.
type entry struct {
	mode         os.FileMode
	owner, group string
	config       bool
}

func debEntries(t *testing.T, path string) map[string]entry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]entry{}
	var conffiles []string
	r := ar.NewReader(f)
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimRight(h.Name, "/")
		if name != "data.tar.gz" && name != "control.tar.gz" {
			continue
		}
		z, err := gzip.NewReader(r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		tr := tar.NewReader(z)
		for {
			th, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			p := strings.TrimPrefix(th.Name, ".")
			if name == "control.tar.gz" {
				if p == "/conffiles" {
					b, _ := io.ReadAll(tr)
					conffiles = strings.Fields(string(b))
				}
				continue
			}
			if th.Typeflag == tar.TypeDir && !strings.HasSuffix(p, "/") {
				p += "/"
			}
			out[p] = entry{mode: os.FileMode(th.Mode).Perm(), owner: th.Uname, group: th.Gname}
		}
	}
	for _, c := range conffiles {
		e, ok := out[c]
		if !ok {
			t.Errorf("conffile %s is not in the package", c)
		}
		e.config = true
		out[c] = e
	}
	return out
}

func rpmEntries(t *testing.T, path string) map[string]entry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pkg, err := rpmutils.ReadRpm(f)
	if err != nil {
		t.Fatal(err)
	}
	fis, err := pkg.Header.GetFiles()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]entry{}
	for _, fi := range fis {
		p := fi.Name()
		mode := os.FileMode(fi.Mode())
		if fi.Mode()&0o170000 == 0o040000 {
			p += "/"
		}
		out[p] = entry{mode: mode.Perm(), owner: fi.UserName(), group: fi.GroupName(),
			config: fi.Flags()&rpmutils.RPMFILE_CONFIG != 0 && fi.Flags()&rpmutils.RPMFILE_NOREPLACE != 0}
	}
	return out
}

// buildStub packages a small stand-in binary, fast.
func buildStub(t *testing.T) (debPath, rpmPath string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "drover")
	os.WriteFile(bin, []byte("#!/bin/sh\necho drover\n"), 0o755)
	cfg := DefaultConfig()
	cfg.Binary, cfg.Version, cfg.Root, cfg.OutDir, cfg.Compression = bin, "v1.2.0", "../..", dir, "gzip:1"
	paths, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || !strings.HasSuffix(paths[0], "_1.2.0_amd64.deb") || !strings.HasSuffix(paths[1], "-1.2.0-1.x86_64.rpm") {
		t.Fatalf("packages %v", paths)
	}
	return paths[0], paths[1]
}

// The .deb and the .rpm install the same files, with the configuration
// file marked as one (kept across upgrades, left when changed), read by
// nfpm's own format libraries and, where installed, by dpkg-deb and rpm.
func TestPackagesListSameFiles(t *testing.T) {
	debPath, rpmPath := buildStub(t)
	debs, rpms := debEntries(t, debPath), rpmEntries(t, rpmPath)
	var debFiles []string
	for p := range debs {
		// dpkg lists every parent directory; rpm only those it owns.
		if !strings.HasSuffix(p, "/") || slices.Contains(Paths(), p) {
			debFiles = append(debFiles, p)
		}
	}
	var rpmFiles []string
	for p := range rpms {
		rpmFiles = append(rpmFiles, p)
	}
	slices.Sort(debFiles)
	slices.Sort(rpmFiles)
	want := slices.Sorted(slices.Values(Paths()))
	if !slices.Equal(debFiles, want) || !slices.Equal(rpmFiles, want) {
		t.Fatalf("files\n.deb %v\n.rpm %v\nwant %v", debFiles, rpmFiles, want)
	}
	for p, e := range debs {
		if e.config != (p == ConfigFile) {
			t.Errorf(".deb: %s config %v", p, e.config)
		}
		if e.owner != "root" || e.group != "root" {
			t.Errorf(".deb: %s owned by %s:%s (postinst hands /etc/drover to the group drover)", p, e.owner, e.group)
		}
	}
	for p, e := range rpms {
		if e.config != (p == ConfigFile) {
			t.Errorf(".rpm: %s %%config(noreplace) %v", p, e.config)
		}
	}
	for p, want := range map[string]entry{
		BinaryPath:      {mode: 0o755, owner: "root", group: "root"},
		ConfigDir + "/": {mode: 0o750, owner: "root", group: "drover"},
		ConfigFile:      {mode: 0o640, owner: "root", group: "drover", config: true},
		ServiceUnit:     {mode: 0o644, owner: "root", group: "root"},
	} {
		if rpms[p] != want {
			t.Errorf(".rpm: %s is %+v, want %+v", p, rpms[p], want)
		}
	}
	if debs[BinaryPath].mode != 0o755 || debs[ConfigFile].mode != 0o644 {
		t.Errorf(".deb modes: %s %v, %s %v", BinaryPath, debs[BinaryPath].mode, ConfigFile, debs[ConfigFile].mode)
	}

	// The distributions' own tools agree.
	if dpkgDeb, err := exec.LookPath("dpkg-deb"); err == nil {
		out, err := exec.Command(dpkgDeb, "--contents", debPath).Output()
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			p := strings.TrimPrefix(f[len(f)-1], ".")
			if _, ok := debs[p]; !ok {
				t.Errorf("dpkg-deb lists %s, which the .deb reader did not see", p)
			}
			listed = append(listed, p)
		}
		if len(listed) != len(debs) {
			t.Errorf("dpkg-deb lists %d entries, the reader %d", len(listed), len(debs))
		}
		out, err = exec.Command(dpkgDeb, "--field", debPath, "Package", "Version", "Architecture", "Depends").Output()
		if err != nil || !strings.Contains(string(out), "Version: 1.2.0\n") || !strings.Contains(string(out), "Architecture: amd64\n") {
			t.Errorf("dpkg-deb --field: %v\n%s", err, out)
		}
	} else {
		t.Log("no dpkg-deb: the .deb read by the Go reader only")
	}
	if rpm, err := exec.LookPath("rpm"); err == nil {
		out, err := exec.Command(rpm, "-qlp", rpmPath).Output()
		if err != nil {
			t.Fatalf("rpm -qlp: %v", err)
		}
		listed := strings.Fields(string(out))
		slices.Sort(listed)
		var wantPlain []string
		for _, p := range want {
			wantPlain = append(wantPlain, strings.TrimSuffix(p, "/"))
		}
		slices.Sort(wantPlain)
		if !slices.Equal(listed, wantPlain) {
			t.Errorf("rpm -qlp lists %v, want %v", listed, wantPlain)
		}
		out, err = exec.Command(rpm, "-qp", "--configfiles", rpmPath).Output()
		if err != nil || strings.TrimSpace(string(out)) != ConfigFile {
			t.Errorf("rpm --configfiles: %v %q", err, out)
		}
		out, err = exec.Command(rpm, "-qp", "--scripts", rpmPath).Output()
		if err != nil || !strings.Contains(string(out), "preinstall scriptlet") || !strings.Contains(string(out), "useradd --system") {
			t.Errorf("rpm --scripts: %v\n%s", err, out)
		}
	} else {
		t.Log("no rpm (Debian: apt-get install rpm): the .rpm read by go-rpmutils only")
	}
}

// The maintainer scripts are POSIX sh that shellcheck passes.
func TestMaintainerScripts(t *testing.T) {
	scripts, _ := filepath.Glob("../../deploy/package/*/*")
	if len(scripts) != 7 {
		t.Fatalf("maintainer scripts %v, want deb/{postinst,prerm,postrm} and rpm/{pre,post,preun,postun}", scripts)
	}
	for _, s := range scripts {
		if err := exec.Command("sh", "-n", s).Run(); err != nil {
			t.Errorf("sh -n %s: %v", s, err)
		}
	}
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Skip("no shellcheck (Debian: shellcheck)")
	}
	if out, err := exec.Command(sc, append([]string{"-s", "sh"}, scripts...)...).CombinedOutput(); err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}
