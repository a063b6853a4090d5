// Package dbtest starts throwaway PostgreSQL and MariaDB servers for tests
// (and builds the drover binary for tests that run real servers, BuildDrover),
// from the server binaries installed on the machine: data and unix sockets
// in a temp dir, TCP on a free loopback port. One server per test binary
// (see Main); each test gets its own database (Server.NewDB).
//
// When the binaries are missing the tests that need them skip, except under
// CI=true, where Main fails the whole binary: CI never skips.
package dbtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/testwait"
)

// Kind names a database server.
type Kind string

const (
	Postgres Kind = "postgres"
	MariaDB  Kind = "mariadb"
)

// ErrNotInstalled is returned by Start when the server binaries are missing.
var ErrNotInstalled = errors.New("database server binaries not installed")

// Test credentials of every server started here.
const (
	User     = "drover"
	Password = "drover-test-pw"
)

// Server is a running throwaway database server.
type Server struct {
	Kind Kind
	Port int
	Dir  string // data directory and unix socket live here
	Host string // the address DSN names: 127.0.0.1, or Options.Host

	bin   string // postgres or mariadbd
	args  []string
	wrap  []string // command prefix of the server process
	cred  *syscall.Credential
	mu    sync.Mutex
	cmd   *exec.Cmd
	exit  chan error
	dbSeq atomic.Int64
}

// Start initialises a new data directory and starts a server of kind.
func Start(kind Kind) (*Server, error) {
	switch kind {
	case Postgres:
		return startPostgres(Options{})
	case MariaDB:
		return startMariaDB()
	}
	return nil, fmt.Errorf("dbtest: unknown kind %q", kind)
}

// Options adjust a PostgreSQL server started by StartPostgres.
type Options struct {
	// Host is an address of this machine the server listens on too, and
	// the one DSN names: e.g. a bridge address that network namespaces
	// reach (internal/clustertest). "": loopback only.
	Host string
	// Clients is the CIDR prefix allowed to connect to Host with the
	// password (a pg_hba.conf line), e.g. "10.77.0.0/24".
	Clients string
	// Wrap runs the server process under this command, e.g. ip netns exec
	// NS (which execs it: the process keeps the PID).
	Wrap []string
}

// StartPostgres starts a PostgreSQL server with o.
func StartPostgres(o Options) (*Server, error) { return startPostgres(o) }

// Main is a TestMain body: it starts one server of each kind wanted (at
// once) into the pointers given, runs the tests and stops the servers.
// Missing binaries fail the binary when CI=true and make Need skip
// otherwise.
//
//	func TestMain(m *testing.M) { os.Exit(dbtest.Main(m, map[dbtest.Kind]**dbtest.Server{dbtest.Postgres: &pg})) }
func Main(m *testing.M, want map[Kind]**Server) int {
	type started struct {
		kind Kind
		s    *Server
		err  error
	}
	ch := make(chan started, len(want))
	for kind := range want {
		go func() {
			s, err := Start(kind)
			ch <- started{kind, s, err}
		}()
	}
	var all []*Server
	failed := false
	for range want {
		r := <-ch
		switch {
		case errors.Is(r.err, ErrNotInstalled) && os.Getenv("CI") != "true":
			fmt.Fprintf(os.Stderr, "dbtest: %v: tests needing %s will skip\n", r.err, r.kind)
			missing[r.kind] = r.err.Error()
		case r.err != nil:
			fmt.Fprintf(os.Stderr, "dbtest: FAIL: starting %s: %v\n", r.kind, r.err)
			failed = true
		default:
			*want[r.kind] = r.s
			all = append(all, r.s)
		}
	}
	code := 1
	if !failed {
		code = m.Run()
	}
	for _, s := range all {
		if err := s.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: stopping %s: %v\n", s.Kind, err)
		}
	}
	return code
}

var missing = map[Kind]string{}

// Need returns s, or skips the test when Main found no binaries (never in CI).
func Need(t testing.TB, kind Kind, s *Server) *Server {
	t.Helper()
	if s == nil {
		if why, ok := missing[kind]; ok {
			t.Skipf("%s: %s (install the server package; CI=true turns this into a failure)", kind, why)
		}
		t.Fatalf("dbtest: no %s server: call dbtest.Main from TestMain", kind)
	}
	return s
}

// tempDir makes a directory short enough for unix socket paths, owned by
// the account the server runs as.
func tempDir(kind Kind, cred *syscall.Credential) (string, error) {
	base := os.TempDir()
	if len(base) > 40 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "drover-"+string(kind)+"-")
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// serverAccount is who runs the server: the current user, or when that is
// root (which PostgreSQL refuses) the named system account, else nobody.
func serverAccount(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("running as root and found neither %s nor nobody to run the server as", name)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}

// run runs a setup command and returns its output with the error.
func (s *Server) run(bin string, args ...string) error {
	cmd := s.command(bin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", filepath.Base(bin), err, out)
	}
	return nil
}

// startProcess starts the server process and waits until ping succeeds.
func (s *Server) startProcess(ping func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("dbtest: already running")
	}
	log, err := os.OpenFile(filepath.Join(s.Dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := s.command(s.bin, s.args...)
	if len(s.wrap) > 0 {
		// The wrapper needs root (setns); setpriv then drops to the
		// server's account. Both exec: the server keeps the PID.
		argv := slices.Clone(s.wrap)
		if s.cred != nil {
			argv = append(argv, "setpriv", fmt.Sprintf("--reuid=%d", s.cred.Uid), fmt.Sprintf("--regid=%d", s.cred.Gid), "--clear-groups")
		}
		cmd = exec.Command(argv[0], append(append(argv[1:], s.bin), s.args...)...)
		cmd.Dir = s.Dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	s.cmd, s.exit = cmd, exit
	var exited bool
	var werr error
	testwait.Until(60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = ping(ctx)
		cancel()
		if err == nil {
			return true
		}
		select {
		case werr = <-exit:
			exited = true
			return true
		default:
			return false
		}
	})
	switch {
	case err == nil:
		return nil
	case exited:
		s.cmd = nil
		return fmt.Errorf("%s exited during start (%v): %v\n%s", filepath.Base(s.bin), werr, err, s.LogTail())
	default:
		s.killLocked()
		return fmt.Errorf("%s did not accept connections within 60 s: %v\n%s", filepath.Base(s.bin), err, s.LogTail())
	}
}

// PID is the server process's ID (0 when stopped).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// LogTail returns the end of the server's log.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Stop shuts the server down cleanly; Restart starts it again.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	// Both servers take SIGTERM as "finish quickly and cleanly"
	// (PostgreSQL: smart shutdown; we want fast, which is SIGINT).
	sig := syscall.SIGTERM
	if s.Kind == Postgres {
		sig = syscall.SIGINT
	}
	s.cmd.Process.Signal(sig)
	select {
	case <-s.exit:
	case <-time.After(60 * time.Second):
		procs := processGroup(s.cmd.Process.Pid)
		s.killLocked()
		return fmt.Errorf("%s did not stop within 60 s; killed. Its processes then (pid state wchan title):\n%s\nthe end of its log:\n%s", s.Kind, procs, s.LogTail())
	}
	s.cmd = nil
	return nil
}

// processGroup lists the processes of group pgid as "pid state wchan
// title" lines (PostgreSQL titles its processes by role and activity),
// to show where a server hangs.
func processGroup(pgid int) string {
	var out []byte
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		state := "?"
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		wchan, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "wchan"))
		title, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		title = bytes.TrimRight(bytes.ReplaceAll(title, []byte{0}, []byte{' '}), " ")
		out = fmt.Appendf(out, "%d %s %s %s\n", pid, state, wchan, title)
	}
	return string(out)
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exit
	s.cmd = nil
}

// Restart starts a stopped server again on the same port and data.
func (s *Server) Restart() error {
	switch s.Kind {
	case Postgres:
		return s.startProcess(s.pingPostgres)
	default:
		return s.startProcess(s.pingMariaDB)
	}
}

// Close stops the server and removes its data.
func (s *Server) Close() error {
	err := s.Stop()
	if rerr := os.RemoveAll(s.Dir); err == nil {
		err = rerr
	}
	return err
}

// NewDB creates an empty database and returns its DSN in Drover's format
// (postgres://… or mysql://…). On PostgreSQL it is a schema of database
// "drover", named in the DSN's search_path: much faster than CREATE
// DATABASE.
func (s *Server) NewDB(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	switch s.Kind {
	case Postgres:
		err = s.execPostgres(ctx, "drover", "CREATE SCHEMA "+name)
	default:
		err = s.execMariaDB(ctx, "CREATE DATABASE "+name)
	}
	if err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	return s.DSN(name)
}

// DSN is the Drover DSN of database (MariaDB) or schema (PostgreSQL) name.
func (s *Server) DSN(name string) string {
	if s.Kind == Postgres {
		return fmt.Sprintf("postgres://%s:%s@%s/drover?sslmode=disable&search_path=%s", User, Password, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), name)
	}
	return fmt.Sprintf("mysql://%s:%s@tcp(127.0.0.1:%d)/%s", User, Password, s.Port, name)
}

// ---- PostgreSQL ----

func postgresBin() (string, error) {
	if dir := os.Getenv("DROVER_TEST_PG_BIN"); dir != "" {
		return dir, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) == 0 {
		if p, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
		return "", fmt.Errorf("%w: no /usr/lib/postgresql/*/bin/postgres (Debian package postgresql)", ErrNotInstalled)
	}
	// The highest major version.
	best, bestV := "", -1
	for _, m := range matches {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
		if v > bestV {
			best, bestV = filepath.Dir(m), v
		}
	}
	return best, nil
}

func startPostgres(o Options) (*Server, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := serverAccount("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := tempDir(Postgres, cred)
	if err != nil {
		return nil, err
	}
	s := &Server{Kind: Postgres, Dir: dir, cred: cred, bin: filepath.Join(bin, "postgres"), Host: "127.0.0.1", wrap: o.Wrap}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	pw := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pw, []byte(Password+"\n"), 0o600); err != nil {
		return fail(err)
	}
	if err := s.chown(pw); err != nil {
		return fail(err)
	}
	if err := s.run(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", User, "--pwfile", pw,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		return fail(err)
	}
	if s.Port, err = freePort(); err != nil {
		return fail(err)
	}
	listen := "127.0.0.1"
	if o.Host != "" {
		s.Host, listen = o.Host, listen+","+o.Host
		hba, err := os.OpenFile(filepath.Join(dir, "data", "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return fail(err)
		}
		_, err = fmt.Fprintf(hba, "host all all %s scram-sha-256\n", o.Clients)
		if cerr := hba.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err)
		}
	}
	// A short deadlock_timeout resolves lock-order waits between the
	// suite's deliberately conflicting writers quickly (default 1 s).
	s.args = []string{"-D", filepath.Join(dir, "data"), "-p", strconv.Itoa(s.Port), "-k", dir,
		"-c", "listen_addresses=" + listen, "-c", "max_connections=200", "-c", "shared_buffers=64MB",
		"-c", "logging_collector=off", "-c", "deadlock_timeout=100ms"}
	if err := s.startProcess(s.pingPostgres); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.execPostgres(ctx, "postgres", "CREATE DATABASE drover"); err != nil {
		s.Kill()
		return fail(err)
	}
	return s, nil
}

func (s *Server) pgConnect(ctx context.Context, db string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", User, Password, net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), db))
}

func (s *Server) pingPostgres(ctx context.Context) error {
	c, err := s.pgConnect(ctx, "postgres")
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

func (s *Server) execPostgres(ctx context.Context, db, q string) error {
	c, err := s.pgConnect(ctx, db)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, q)
	return err
}

// ---- MariaDB ----

func mariadbBins() (server, install string, err error) {
	for _, p := range []string{"/usr/sbin/mariadbd", "/usr/sbin/mysqld"} {
		if _, err := os.Stat(p); err == nil {
			server = p
			break
		}
	}
	if server == "" {
		if p, err := exec.LookPath("mariadbd"); err == nil {
			server = p
		}
	}
	for _, n := range []string{"mariadb-install-db", "mysql_install_db"} {
		if p, err := exec.LookPath(n); err == nil {
			install = p
			break
		}
	}
	if server == "" || install == "" {
		return "", "", fmt.Errorf("%w: no mariadbd and mariadb-install-db (Debian package mariadb-server)", ErrNotInstalled)
	}
	return server, install, nil
}

func startMariaDB() (*Server, error) {
	bin, install, err := mariadbBins()
	if err != nil {
		return nil, err
	}
	cred, err := serverAccount("mysql")
	if err != nil {
		return nil, err
	}
	dir, err := tempDir(MariaDB, cred)
	if err != nil {
		return nil, err
	}
	s := &Server{Kind: MariaDB, Dir: dir, cred: cred, bin: bin, Host: "127.0.0.1"}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := s.run(install, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve", "--innodb-log-file-size=16M"); err != nil {
		return fail(err)
	}
	if s.Port, err = freePort(); err != nil {
		return fail(err)
	}
	// Its own temporary directory: /tmp is shared with whatever else the
	// machine runs, which may clean it while a statement's file is open.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fail(err)
	}
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	s.args = []string{"--no-defaults", "--datadir=" + data, "--tmpdir=" + tmp, "--port=" + strconv.Itoa(s.Port), "--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(dir, "mysqld.sock"), "--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		"--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=128M", "--innodb-log-file-size=16M",
		"--max-connections=200", "--log-error=" + filepath.Join(dir, "server.log")}
	if os.Geteuid() == 0 && cred == nil {
		s.args = append(s.args, "--user=root")
	}
	// The first start has only root on the socket; it creates the test user.
	root := func(ctx context.Context) (*sql.DB, error) {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Net, cfg.Addr = "root", "unix", filepath.Join(dir, "mysqld.sock")
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return nil, err
		}
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return db, nil
	}
	if err := s.startProcess(func(ctx context.Context) error {
		db, err := root(ctx)
		if err == nil {
			db.Close()
		}
		return err
	}); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := root(ctx)
	if err != nil {
		s.Kill()
		return fail(err)
	}
	defer db.Close()
	for _, q := range []string{
		"CREATE USER '" + User + "'@'%' IDENTIFIED BY '" + Password + "'",
		"GRANT ALL ON *.* TO '" + User + "'@'%'",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			s.Kill()
			return fail(fmt.Errorf("%s: %w", q, err))
		}
	}
	return s, nil
}

func (s *Server) mariadbAdmin() (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr = User, Password, "tcp", "127.0.0.1:"+strconv.Itoa(s.Port)
	return sql.Open("mysql", cfg.FormatDSN())
}

func (s *Server) pingMariaDB(ctx context.Context) error {
	db, err := s.mariadbAdmin()
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

func (s *Server) execMariaDB(ctx context.Context, q string) error {
	db, err := s.mariadbAdmin()
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, q)
	return err
}
