package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/coder/websocket"
	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/buildinfo"
	"github.com/drover/drover/internal/tunnel"
	"golang.org/x/term"
)

// remoteFlags are the server flags of drover tunnel, terminal and files.
type remoteFlags struct {
	c        tunnel.Client
	caFile   string
	insecure bool
}

func (f *remoteFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.c.Server, "server", "", "URL of drover serve, e.g. https://drover.example.com:8443 (required)")
	fs.StringVar(&f.c.Token, "token", "", "API token of an operator or admin (drover user token; or DROVER_TOKEN)")
	fs.StringVar(&f.caFile, "ca-cert", "", "PEM file of the CA, or of the server's self-signed certificate, to trust (default: system roots)")
	fs.BoolVar(&f.insecure, "insecure", false, "do not verify the server's certificate")
}

// client is the configured client.
func (f *remoteFlags) client() (*tunnel.Client, error) {
	if f.c.Server == "" || f.c.Token == "" {
		return nil, command.Usagef("--server and --token are required")
	}
	cfg := &tls.Config{InsecureSkipVerify: f.insecure}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-cert %s: no PEM certificate in it", f.caFile)
		}
	}
	f.c.TLS = cfg
	f.c.UserAgent = "drover/" + buildinfo.Version()
	return &f.c, nil
}

// deviceArg checks a device ID argument.
func deviceArg(s string) error {
	if id, err := strconv.ParseUint(s, 10, 64); err != nil || id == 0 {
		return command.Usagef("device %q: a device ID is a positive integer", s)
	}
	return nil
}

// refused words an API refusal of a remote session.
func refused(what, device string, err error) error {
	var ae *tunnel.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("%s on device %s refused: %s (%s)", what, device, ae.Message, ae.Code)
	}
	return fmt.Errorf("%s on device %s: %w", what, device, err)
}

// exitStatus is a remote command's non-zero exit status, drover
// terminal's own.
type exitStatus int

func (e exitStatus) Error() string {
	return fmt.Sprintf("the remote shell exited with status %d", int(e))
}
func (e exitStatus) ExitCode() int {
	if e < 0 || e > 255 {
		return 1
	}
	return int(e)
}

// terminalCmd is `drover terminal DEVICE [-- COMMAND...]`: a shell on the
// device (docs/remote-access.md).
func terminalCmd(ctx context.Context, args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover terminal", flag.ContinueOnError)
	var rf remoteFlags
	rf.define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover terminal --server URL --token T [flags] DEVICE [-- COMMAND...]\n\n"+
			"Opens a shell on the device, on a terminal of this one's size (raw mode,\n"+
			"restored on exit; the remote shell's exit ends it), through the device's\n"+
			"persistent connection. With COMMAND, runs it with the device's shell, without\n"+
			"a terminal or input, prints its output and exits with its status. The\n"+
			"device's agent must run with --connect and --remote-shell.\n"+
			"Example: drover terminal --server https://drover:8443 --token drv_… 42 -- uptime\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return command.Usagef("name a device ID")
	}
	device := fs.Arg(0)
	if err := deviceArg(device); err != nil {
		return err
	}
	c, err := rf.client()
	if err != nil {
		return err
	}
	words := fs.Args()[1:]
	if len(words) > 0 && words[0] == "--" {
		words = words[1:]
	}
	o := tunnel.TerminalOptions{Command: strings.Join(words, " ")}
	in, _ := env.Stdin.(*os.File)
	out, _ := env.Stdout.(*os.File)
	raw := o.Command == "" && in != nil && term.IsTerminal(int(in.Fd()))
	if raw && out != nil {
		if w, h, err := term.GetSize(int(out.Fd())); err == nil && w > 0 && h > 0 {
			o.Cols, o.Rows = uint16(min(w, 1000)), uint16(min(h, 1000))
		}
	}
	ws, err := c.Terminal(ctx, device, o)
	if err != nil {
		return refused("terminal", device, err)
	}
	defer ws.CloseNow()
	if raw {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		if out != nil {
			stop := onResize(func() {
				if w, h, err := term.GetSize(int(out.Fd())); err == nil {
					b, _ := json.Marshal(map[string]any{"type": "resize", "cols": w, "rows": h})
					ws.Write(ctx, websocket.MessageText, b)
				}
			})
			defer stop()
		}
	}
	if o.Command == "" && env.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := env.Stdin.Read(buf)
				if n > 0 && ws.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	var status *int
	for {
		typ, msg, err := ws.Read(ctx)
		if err != nil {
			if status != nil {
				if *status != 0 {
					return exitStatus(*status)
				}
				return nil
			}
			if ctx.Err() != nil {
				return nil
			}
			if cs := websocket.CloseStatus(err); cs != -1 {
				var ce websocket.CloseError
				errors.As(err, &ce)
				return fmt.Errorf("the terminal session ended: %s", ce.Reason)
			}
			return fmt.Errorf("the terminal session ended: %w", err)
		}
		if typ == websocket.MessageBinary {
			env.Stdout.Write(msg)
			continue
		}
		var m struct {
			Type   string
			Status *int
		}
		if json.Unmarshal(msg, &m) == nil && m.Type == "exit" && m.Status != nil {
			status = m.Status
		}
	}
}

// filesCmd is `drover files put|get`: file transfer to and from a device
// (docs/remote-access.md).
func filesCmd(ctx context.Context, args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover files", flag.ContinueOnError)
	var rf remoteFlags
	rf.define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover files put [flags] DEVICE LOCAL REMOTE\n"+
			"       drover files get [flags] DEVICE REMOTE LOCAL\n\n"+
			"Copies a file to the device (put: LOCAL, or - for standard input, to the\n"+
			"absolute path REMOTE) or from it (get: REMOTE to LOCAL, or - for standard\n"+
			"output), through the device's persistent connection, and checks its SHA-256.\n"+
			"The device's agent must run with --connect and allow REMOTE's directory in its\n"+
			"--files-allow, up to its --files-max-size.\n"+
			"Example: drover files put --server https://drover:8443 --token drv_… 42 app.conf /etc/app/app.conf\n\nflags:\n")
		fs.PrintDefaults()
	}
	var sub string
	if len(args) > 0 && (args[0] == "put" || args[0] == "get") {
		sub, args = args[0], args[1:]
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	rest := fs.Args()
	if sub == "" && len(rest) > 0 {
		sub, rest = rest[0], rest[1:]
	}
	if sub != "put" && sub != "get" {
		return command.Usagef("say put or get")
	}
	if len(rest) != 3 {
		return command.Usagef("files %s takes DEVICE and two paths", sub)
	}
	device := rest[0]
	if err := deviceArg(device); err != nil {
		return err
	}
	remote := rest[2]
	if sub == "get" {
		remote = rest[1]
	}
	if !strings.HasPrefix(remote, "/") {
		return command.Usagef("%q: the device's path must be absolute", remote)
	}
	c, err := rf.client()
	if err != nil {
		return err
	}
	if sub == "put" {
		return putFile(ctx, c, env, device, rest[1], remote)
	}
	return getFile(ctx, c, env, device, remote, rest[2])
}

func putFile(ctx context.Context, c *tunnel.Client, env command.Env, device, local, remote string) error {
	var body io.Reader = env.Stdin
	var size int64
	if local == "-" {
		// The size must be known first: standard input is read whole.
		b, err := io.ReadAll(env.Stdin)
		if err != nil {
			return err
		}
		body, size = strings.NewReader(string(b)), int64(len(b))
	} else {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", local)
		}
		body, size = f, fi.Size()
	}
	h := sha256.New()
	res, err := c.Put(ctx, device, remote, io.TeeReader(body, h), size)
	if err != nil {
		return refused("upload of "+remote, device, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if res.SHA256 != sum {
		return fmt.Errorf("upload of %s on device %s: the device wrote SHA-256 %s, this file's is %s", remote, device, res.SHA256, sum)
	}
	fmt.Fprintf(env.Stdout, "%s → device %s:%s, %d bytes, sha256 %s\n", local, device, remote, res.Size, sum)
	return nil
}

func getFile(ctx context.Context, c *tunnel.Client, env command.Env, device, remote, local string) error {
	var w io.Writer = env.Stdout
	var tmp *os.File
	if local != "-" {
		var err error
		if tmp, err = os.CreateTemp(filepath.Dir(local), ".drover-download-*"); err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		w = tmp
	}
	h := sha256.New()
	n, err := c.Get(ctx, device, remote, io.MultiWriter(w, h))
	if err != nil {
		return refused("download of "+remote, device, err)
	}
	if tmp == nil {
		return nil
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), local); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "device %s:%s → %s, %d bytes, sha256 %s\n", device, remote, local, n, hex.EncodeToString(h.Sum(nil)))
	return nil
}
