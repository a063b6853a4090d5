package cluster

// Remote sessions across nodes (docs/remote-access.md#in-a-cluster): a
// node asked for a session to a device whose persistent connection
// another node holds asks the cluster on NATS where it is; the node
// holding it answers with the address other nodes reach it at. Answers
// and relayed requests are signed with a key the nodes share through the
// database, so that neither a NATS client nor a client of the nodes can
// redirect or pass for a relay.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// subjWhere carries "which node holds device D's connection?".
const subjWhere = ".where"

// locateWait bounds how long Locate waits for the holder's answer: a
// device connected to no node costs this much.
const locateWait = 500 * time.Millisecond

// relayFresh is how long a relay credential is valid.
const relayFresh = time.Minute

// Peer is how other nodes reach a node, to relay a session to it.
type Peer struct {
	Node string `json:"n"`
	URL  string `json:"u"` // its listener: https://host:port or http://host:port
	// CertSHA256 is the SHA-256 of the certificate it serves there (hex);
	// "": verified as usual (or plain HTTP).
	CertSHA256 string `json:"c,omitempty"`
}

// ErrNotHeld says no node answered that it holds the device's connection
// (or NATS is down: then no node can be asked).
var ErrNotHeld = errors.New("no node holds the device's persistent connection")

// whereAsk and whereAnswer are the messages of subjWhere.
type whereAsk struct {
	Dev   uint64 `json:"d"`
	Nonce string `json:"q"`
}

type whereAnswer struct {
	Peer
	Dev uint64 `json:"d"`
	MAC string `json:"m"`
}

// ServeLocate makes the node answer where-requests for the devices holds
// says it holds, with self; call it before Run.
func (n *Node) ServeLocate(holds func(dev uint64) bool, self func() Peer) {
	n.holds, n.selfPeer = holds, self
}

// loadRelayKey reads (or makes) the key the nodes sign relays with.
func (n *Node) loadRelayKey(ctx context.Context) error {
	b := make([]byte, 32)
	rand.Read(b)
	k, err := n.st.ClusterSecret(ctx, "cluster_relay_key", hex.EncodeToString(b))
	if err != nil {
		return err
	}
	n.relayKey = []byte(k)
	return nil
}

func (n *Node) mac(parts ...string) string {
	m := hmac.New(sha256.New, n.relayKey)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil))
}

func (a whereAnswer) signed(n *Node, nonce string) string {
	return n.mac("where", strconv.FormatUint(a.Dev, 10), nonce, a.Node, a.URL, a.CertSHA256)
}

// subscribeWhere answers where-requests (connect).
func (n *Node) subscribeWhere() {
	if n.holds == nil {
		return
	}
	n.nc.Subscribe(n.prefix+subjWhere, func(m *nats.Msg) {
		var q whereAsk
		if json.Unmarshal(m.Data, &q) != nil || m.Reply == "" || !n.holds(q.Dev) {
			return
		}
		a := whereAnswer{Peer: n.selfPeer(), Dev: q.Dev}
		a.Node = n.cfg.Node
		a.MAC = a.signed(n, q.Nonce)
		b, _ := json.Marshal(a)
		m.Respond(b)
	})
}

// Locate asks the other nodes which one holds dev's persistent
// connection: ErrNotHeld when none answers within half a second.
func (n *Node) Locate(ctx context.Context, dev uint64) (Peer, error) {
	if n.nc == nil || !n.natsUp.Load() {
		return Peer{}, ErrNotHeld
	}
	nb := make([]byte, 16)
	rand.Read(nb)
	q := whereAsk{Dev: dev, Nonce: hex.EncodeToString(nb)}
	inbox := n.nc.NewRespInbox()
	sub, err := n.nc.SubscribeSync(inbox)
	if err != nil {
		return Peer{}, ErrNotHeld
	}
	defer sub.Unsubscribe()
	b, _ := json.Marshal(q)
	if err := n.nc.PublishRequest(n.prefix+subjWhere, inbox, b); err != nil {
		return Peer{}, ErrNotHeld
	}
	ctx, cancel := context.WithTimeout(ctx, locateWait)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return Peer{}, ErrNotHeld
		}
		var a whereAnswer
		if json.Unmarshal(m.Data, &a) != nil || a.Dev != dev || a.Node == n.cfg.Node ||
			!hmac.Equal([]byte(a.MAC), []byte(a.signed(n, q.Nonce))) {
			continue // not an answer of this cluster's nodes
		}
		return a.Peer, nil
	}
}

// RelayCredential is the credential a relayed request carries: this
// node's name, the time, the operator's address, signed over the method
// and the request's path and query.
func (n *Node) RelayCredential(method, uri, client string) string {
	t := strconv.FormatInt(time.Now().Unix(), 10)
	return strings.Join([]string{n.cfg.Node, t, client, n.mac("relay", n.cfg.Node, t, client, method, uri)}, " ")
}

// CheckRelay verifies a relayed request's credential and returns the
// relaying node and the operator's address.
func (n *Node) CheckRelay(cred, method, uri string) (node, client string, err error) {
	f := strings.Split(cred, " ")
	if len(f) != 4 {
		return "", "", errors.New("malformed")
	}
	t, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", "", errors.New("malformed")
	}
	if d := time.Since(time.Unix(t, 0)); d > relayFresh || d < -relayFresh {
		return "", "", fmt.Errorf("made %v ago: clocks apart, or replayed", d.Round(time.Second))
	}
	if !hmac.Equal([]byte(f[3]), []byte(n.mac("relay", f[0], f[1], f[2], method, uri))) {
		return "", "", errors.New("not signed by a node of this cluster")
	}
	return f[0], f[2], nil
}

// subjConnect carries "ask device D to connect at its next push, until U":
// its push may reach any node.
const subjConnect = ".connect"

type connectAsk struct {
	Dev   uint64 `json:"d"`
	Until int64  `json:"u"` // unix ms
	MAC   string `json:"m"`
}

// OnConnectAsk sets what takes the other nodes' asks to devices to
// connect; call it before Run.
func (n *Node) OnConnectAsk(f func(dev uint64, until time.Time)) { n.connectAsk = f }

// AskConnect tells the other nodes to ask dev to connect in the answer to
// its next push, until until.
func (n *Node) AskConnect(dev uint64, until time.Time) {
	if n.nc == nil || !n.natsUp.Load() {
		return
	}
	a := connectAsk{Dev: dev, Until: until.UnixMilli()}
	a.MAC = n.mac("connect", n.cfg.Node, strconv.FormatUint(dev, 10), strconv.FormatInt(a.Until, 10))
	b, _ := json.Marshal(struct {
		Node string `json:"n"`
		connectAsk
	}{n.cfg.Node, a})
	n.nc.Publish(n.prefix+subjConnect, b)
}

// subscribeConnect takes the other nodes' asks (connect).
func (n *Node) subscribeConnect() {
	if n.connectAsk == nil {
		return
	}
	n.nc.Subscribe(n.prefix+subjConnect, func(m *nats.Msg) {
		var a struct {
			Node string `json:"n"`
			connectAsk
		}
		if json.Unmarshal(m.Data, &a) != nil || a.Node == n.cfg.Node ||
			!hmac.Equal([]byte(a.MAC), []byte(n.mac("connect", a.Node, strconv.FormatUint(a.Dev, 10), strconv.FormatInt(a.Until, 10)))) {
			return
		}
		n.connectAsk(a.Dev, time.UnixMilli(a.Until))
	})
}
