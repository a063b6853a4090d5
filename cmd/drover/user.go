package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/drover/drover/cmd/internal/command"
	"github.com/drover/drover/internal/access"
	"github.com/drover/drover/internal/server"
)

const userUsage = `usage: drover user [flags] add NAME ROLE | list | role NAME ROLE | passwd NAME | delete NAME | token NAME TOKEN-NAME

Manages the dashboard and API users in the database drover serve would open
with the same flags, DROVER_* environment and config file, without a
server: the way to make the first admin. While a server runs on the
database, use the API or the dashboard with the admin token instead
(docs/security.md). Roles: admin, operator, viewer.

  add NAME ROLE        a new user; its password is read from stdin with
                       --password-stdin, else generated and printed once
  list                 the users and their tokens
  role NAME ROLE       change a user's role
  passwd NAME          set a user's password (--password-stdin, or generated)
  delete NAME          delete a user and its API tokens
  token NAME TNAME     a new API token of the user, printed once
                       (--expires: lifetime, default none)

Each change is written to the audit log as done by "cli:<OS user>".

flags:
`

// userCmd is `drover user`.
func userCmd(ctx context.Context, args []string, env command.Env) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("drover user", flag.ContinueOnError)
	storeFlags(fs, &cfg)
	fromStdin := fs.Bool("password-stdin", false, "read the password from the first line of stdin")
	expires := fs.Duration("expires", 0, "token: lifetime of the new token (0: no expiry)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), userUsage)
		fs.PrintDefaults()
	}
	if err := command.Load(fs, args, env, serveKeys()...); err != nil {
		return err
	}
	a := fs.Args()
	want := map[string]int{"add": 3, "list": 1, "role": 3, "passwd": 2, "delete": 2, "token": 3}
	if len(a) == 0 || want[a[0]] == 0 {
		return command.Usagef("name one of: add, list, role, passwd, delete, token")
	}
	if len(a) != want[a[0]] {
		return command.Usagef("%s takes %d argument(s)", a[0], want[a[0]]-1)
	}
	var role access.Role
	if a[0] == "add" || a[0] == "role" {
		var err error
		if role, err = access.ParseRole(a[2]); err != nil {
			return command.Usagef("%v", err)
		}
	}
	password := func() (string, bool, error) {
		if !*fromStdin {
			b := make([]byte, 15)
			rand.Read(b)
			return base64.RawURLEncoding.EncodeToString(b), true, nil
		}
		line, err := bufio.NewReader(env.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return "", false, fmt.Errorf("no password on stdin: %w", err)
		}
		return strings.TrimRight(line, "\r\n"), false, nil
	}
	svc, closeStore, err := server.OpenAccess(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeStore()
	actor := "cli"
	if u, err := user.Current(); err == nil {
		actor = "cli:" + u.Username
	}
	record := func(action, object string, before, after any) error {
		js := func(v any) json.RawMessage {
			if v == nil {
				return nil
			}
			b, _ := json.Marshal(v)
			return b
		}
		return svc.Record(ctx, access.Entry{Actor: actor, Credential: "local", Remote: "local", Action: action, Object: object,
			Before: js(before), After: js(after)})
	}
	out := env.Stdout
	switch a[0] {
	case "list":
		us, err := svc.Users(ctx)
		if err != nil {
			return err
		}
		ts, err := svc.Tokens(ctx, "")
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "USER\tROLE\tPASSWORD\tTOKENS")
		for _, u := range us {
			var names []string
			for _, t := range ts {
				if t.User == u.Name && t.Live(time.Now()) {
					names = append(names, t.Name)
				}
			}
			pw := "set"
			if u.PasswordHash == "" {
				pw = "none"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.Name, u.Role, pw, strings.Join(names, ","))
		}
		return tw.Flush()
	case "add":
		pw, generated, err := password()
		if err != nil {
			return err
		}
		u, err := svc.AddUser(ctx, a[1], role, pw)
		if err != nil {
			return err
		}
		if err := record("drover user add", "/api/v1/users/"+u.Name, nil, u); err != nil {
			return err
		}
		fmt.Fprintf(out, "user %s (%s) added\n", u.Name, u.Role)
		if generated {
			fmt.Fprintf(out, "password: %s\n", pw)
		}
	case "role", "passwd":
		before, err := svc.User(ctx, a[1])
		if err != nil {
			return fmt.Errorf("user %q: %w", a[1], err)
		}
		var c access.UserChange
		var pw string
		generated := false
		if a[0] == "role" {
			c.Role = &role
		} else {
			if pw, generated, err = password(); err != nil {
				return err
			}
			c.Password = &pw
		}
		u, err := svc.UpdateUser(ctx, a[1], c)
		if err != nil {
			return err
		}
		if err := record("drover user "+a[0], "/api/v1/users/"+u.Name, before, u); err != nil {
			return err
		}
		fmt.Fprintf(out, "user %s (%s) changed\n", u.Name, u.Role)
		if generated {
			fmt.Fprintf(out, "password: %s\n", pw)
		}
	case "delete":
		before, err := svc.User(ctx, a[1])
		if err != nil {
			return fmt.Errorf("user %q: %w", a[1], err)
		}
		if err := svc.DeleteUser(ctx, a[1]); err != nil {
			return err
		}
		if err := record("drover user delete", "/api/v1/users/"+a[1], before, nil); err != nil {
			return err
		}
		fmt.Fprintf(out, "user %s deleted\n", a[1])
	case "token":
		var exp time.Time
		if *expires > 0 {
			exp = time.Now().Add(*expires)
		}
		t, secret, err := svc.CreateToken(ctx, a[1], a[2], exp)
		if err != nil {
			return err
		}
		if err := record("drover user token", "/api/v1/tokens/"+t.ID, nil, t); err != nil {
			return err
		}
		fmt.Fprintf(out, "token %s (id %s) of %s: %s\n", t.Name, t.ID, t.User, secret)
	}
	return nil
}
