package cluster

import "testing"

// Credentials in --nats-url never reach the log.
func TestRedactURLs(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                            "nats://127.0.0.1:4222",
		"nats://drover:s3cret@a:4222,nats://s3cret@b:4222": "nats://drover:***@a:4222,nats://***@b:4222",
		"nats://drover:s3cret@a:4222, nats://c:4222":       "nats://drover:***@a:4222, nats://c:4222",
		"%zz:s3cret@a": "***",
		"":             "",
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
