package cluster

import (
	"net/url"
	"strings"
)

// RedactURLs is a comma-separated list of URLs (--nats-url) as the log
// shows it: the credentials of each (nats://user:password@host,
// nats://token@host) replaced by "***", the user name kept when a
// password follows it.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			if strings.Contains(p, "@") {
				parts[i] = "***" // unparsable, perhaps with credentials: not shown
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "***")
		} else {
			u.User = url.User("***")
		}
		parts[i] = strings.Replace(u.String(), "%2A%2A%2A", "***", 1)
	}
	return strings.Join(parts, ",")
}
