package server

// Remote sessions in a cluster (docs/remote-access.md#in-a-cluster): an
// operator's tunnel, terminal or transfer reaching a node that does not
// hold the device's persistent connection is relayed, unchanged (the
// operator's own credentials, the upgrade), to the node that holds it,
// found through the cluster (cluster.Node.Locate). That node checks,
// limits and audits the session as any other; this node only carries the
// bytes. The relayed request carries a credential signed with the
// cluster's key naming this node and the operator's address.

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/drover/drover/internal/cluster"
	"github.com/prometheus/client_golang/prometheus"
)

// relayHeader carries a relayed request's credential.
const relayHeader = "X-Drover-Relay"

// relays carries sessions to other nodes.
type relays struct {
	node  *cluster.Node
	count prometheus.Counter // sessions relayed
	mu    sync.Mutex
	tr    map[cluster.Peer]*http.Transport
}

// transport is the HTTP transport to p: its certificate pinned when it
// names one.
func (rl *relays) transport(p cluster.Peer, open time.Duration) *http.Transport {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if t := rl.tr[p]; t != nil {
		return t
	}
	if len(rl.tr) > 64 { // nodes come and go: keep the recent few
		for k, t := range rl.tr {
			t.CloseIdleConnections()
			delete(rl.tr, k)
		}
	}
	t := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: open}).DialContext,
		TLSHandshakeTimeout: open, ResponseHeaderTimeout: 0, ExpectContinueTimeout: open,
		MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: false}
	if p.CertSHA256 != "" {
		want := p.CertSHA256
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, // the pin below verifies
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("no certificate")
				}
				if sum := sha256.Sum256(cs.PeerCertificates[0].Raw); hex.EncodeToString(sum[:]) != want {
					return errors.New("the node's certificate is not the one it named")
				}
				return nil
			}}
	}
	rl.tr[p] = t
	return t
}

// relay relays r to the node holding op's device when this node does not
// hold it and another does; true when it answered.
func (a *api) relay(w http.ResponseWriter, r *http.Request, op *remoteOp) bool {
	if a.relays == nil || op.via != "" || a.hub.holds(op.dev) {
		return false
	}
	peer, err := a.relays.node.Locate(r.Context(), op.dev)
	if err != nil {
		return false
	}
	target, err := url.Parse(peer.URL)
	if err != nil {
		return false
	}
	if a.relays.count != nil {
		a.relays.count.Inc()
	}
	// The relayed session lasts as long as the holder lets it.
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(a.tunnels.lim.MaxDuration + time.Minute)
	rc.SetReadDeadline(deadline)
	rc.SetWriteDeadline(deadline)
	cred := a.relays.node.RelayCredential(r.Method, r.URL.RequestURI(), remoteAddr(r))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the dashboard's WebSocket checks its origin
			pr.Out.Header.Set(relayHeader, cred)
		},
		Transport:     a.relays.transport(peer, a.tunnels.lim.Open),
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			// The holder's name, apart from this node's own.
			if v := resp.Header.Values("X-Drover-Node"); len(v) > 0 {
				resp.Header.Del("X-Drover-Node")
				resp.Header["X-Drover-Device-Node"] = v
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			a.log.Warn("remote session relay failed", "device_id", op.dev, "node", peer.Node, "url", peer.URL, "err", err)
			a.fail(w, op.rt, &apiError{status: http.StatusBadGateway, code: "relay_failed",
				msg: "the device is connected to node " + peer.Node + ", which this node could not reach: " + err.Error()})
		},
	}
	rp.ServeHTTP(relayWriter{w}, r)
	return true
}

// relayWriter hands the reverse proxy the client's bytes read ahead of an
// upgrade with the hijacked connection.
type relayWriter struct{ http.ResponseWriter }

func (rw relayWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

func (rw relayWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(rw.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if brw.Reader.Buffered() > 0 {
		nc = &bufferedConn{Conn: nc, r: brw.Reader}
	}
	return nc, brw, nil
}

// relayedFrom checks a relayed request's credential: the relaying node
// and the operator's address, or the error to refuse it with; "" when
// the request is not relayed.
func (a *api) relayedFrom(r *http.Request) (via string, err error) {
	cred := r.Header.Get(relayHeader)
	if cred == "" {
		return "", nil
	}
	if a.relays == nil {
		return "", errBadRelay("this server does not run in cluster mode")
	}
	node, client, err := a.relays.node.CheckRelay(cred, r.Method, r.URL.RequestURI())
	if err != nil {
		return "", errBadRelay(err.Error())
	}
	r.RemoteAddr = net.JoinHostPort(client, "0") // the operator's, for the audit log
	return node, nil
}

func errBadRelay(why string) error {
	return &apiError{status: http.StatusForbidden, code: "forbidden", msg: "the request's " + relayHeader + " credential is not valid: " + why}
}

// relaySelf is how the other nodes reach this one (cluster.Peer).
func (s *Server) relaySelf() cluster.Peer {
	u := s.cfg.NodeURL
	if u == "" {
		ln, scheme := s.httpsLn, "https"
		if ln == nil {
			ln, scheme = s.httpLn, "http"
		}
		if ln == nil {
			return cluster.Peer{}
		}
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host, _ = os.Hostname()
		}
		u = scheme + "://" + net.JoinHostPort(host, port)
	}
	p := cluster.Peer{URL: u}
	if pu, err := url.Parse(u); err == nil && pu.Scheme == "https" && s.httpsLn != nil {
		hello := &tls.ClientHelloInfo{}
		if net.ParseIP(pu.Hostname()) == nil {
			hello.ServerName = pu.Hostname()
		}
		if c, err := s.getCertificate(hello); err == nil && c != nil && len(c.Certificate) > 0 {
			if _, err := x509.ParseCertificate(c.Certificate[0]); err == nil {
				sum := sha256.Sum256(c.Certificate[0])
				p.CertSHA256 = hex.EncodeToString(sum[:])
			}
		}
	}
	return p
}
