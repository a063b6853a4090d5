package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/tunnel"
)

// tunnelCmd is `drover tunnel DEVICE LOCALPORT:HOST:PORT`: a local port
// forwarded to HOST:PORT as seen from the device (docs/remote-access.md).
func tunnelCmd(ctx context.Context, args []string, env command.Env) error {
	fs := flag.NewFlagSet("drover tunnel", flag.ContinueOnError)
	var rf remoteFlags
	var listen string
	rf.define(fs)
	fs.StringVar(&listen, "listen", "127.0.0.1", "local address the forwarded port listens on")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: drover tunnel --server URL --token T [flags] DEVICE LOCALPORT:HOST:PORT\n\n"+
			"Opens LOCALPORT on this machine; every connection to it reaches HOST:PORT as\n"+
			"seen from the device (the device itself, or a host on its LAN), through the\n"+
			"device's persistent connection. The device's agent must run with --connect and\n"+
			"allow HOST:PORT in its --tunnel-allow. LOCALPORT 0 picks a free port.\n"+
			"Example: drover tunnel --server https://drover:8443 --token drv_… 42 8080:192.168.1.1:80\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return command.Usagef("name a device ID and LOCALPORT:HOST:PORT")
	}
	device := fs.Arg(0)
	if err := deviceArg(device); err != nil {
		return err
	}
	lport, dest, ok := strings.Cut(fs.Arg(1), ":")
	if _, err := strconv.ParseUint(lport, 10, 16); !ok || err != nil {
		return command.Usagef("%q is not LOCALPORT:HOST:PORT", fs.Arg(1))
	}
	if _, _, err := tunnel.SplitDestination(dest); err != nil {
		return command.Usage(err)
	}
	c, err := rf.client()
	if err != nil {
		return err
	}
	if err := c.Check(ctx, device, dest); err != nil {
		return refused("tunnel to "+dest, device, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(listen, lport))
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "forwarding %s to %s on device %s (Ctrl-C ends)\n", ln.Addr(), dest, device)
	return c.Forward(ctx, ln, device, dest, func(format string, args ...any) {
		fmt.Fprintf(env.Stderr, format+"\n", args...)
	})
}
