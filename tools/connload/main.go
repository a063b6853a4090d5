// Command connload holds many idle persistent connections to a Drover
// server (WebSocket, as `drover agent --connect`) or to an MQTT broker, for
// the measurements in docs/performance.md#persistent-connections. Each
// connection that is told to push (WebSocket) or gets a message (MQTT)
// prints "got <index> <unix ns>" once it has the command in hand; stderr
// says every 2 s "up <open connections> ended <connections ended>" (an
// ended connection is dialled again, as the agent does). Run
// several, each from its own loopback source address: one process holds
// fewer than its open-files limit.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

func main() {
	url := flag.String("url", "", "Drover server base URL (WebSocket mode)")
	ca := flag.String("ca", "", "PEM file of the server's certificate")
	tokens := flag.String("tokens", "tokens.txt", "device tokens, one per line (WebSocket mode)")
	broker := flag.String("mqtt", "", "MQTT broker host:port (MQTT mode: subscribe to d/<index>)")
	mqttTLS := flag.Bool("mqtt-tls", false, "MQTT over TLS, trusting -ca")
	from := flag.Int("from", 0, "first index (token line)")
	n := flag.Int("n", 1000, "connections")
	source := flag.String("source", "127.0.0.1", "local address to connect from")
	flag.Parse()
	local := &net.TCPAddr{IP: net.ParseIP(*source)}
	dialer := &net.Dialer{LocalAddr: local, Timeout: 30 * time.Second}
	var up, ended atomic.Int64 // connections open now; connections that ended
	// again holds a connection: dialled again whenever it ends.
	again := func(what string, i int, hold func() error) {
		for {
			err := retry(hold)
			if _, ok := err.(errDialed); !ok {
				log.Printf("%s %d: %v", what, i, err) // never set up: give up
				return
			}
			up.Add(-1)
			ended.Add(1)
			log.Printf("%s %d ended: %v", what, i, err)
			time.Sleep(time.Second + time.Duration(rand.Int64N(int64(2*time.Second))))
		}
	}
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	got := func(i int) {
		outMu.Lock()
		fmt.Fprintf(out, "got %d %d\n", i, time.Now().UnixNano())
		out.Flush()
		outMu.Unlock()
	}
	var wg sync.WaitGroup
	var tlsConf *tls.Config
	if *ca != "" {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(*ca)
		if err != nil {
			log.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
		tlsConf = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	}
	if *broker != "" && !*mqttTLS {
		tlsConf = nil
	}
	if *broker != "" {
		for i := *from; i < *from+*n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				again("mqtt", i, func() error { return mqttHold(dialer, tlsConf, *broker, i, &up, got) })
			}()
			if i%100 == 99 {
				time.Sleep(20 * time.Millisecond) // do not flood the accept queue
			}
		}
	} else {
		if tlsConf == nil {
			log.Fatal("-ca is needed")
		}
		tr := &http.Transport{TLSClientConfig: tlsConf, DialContext: dialer.DialContext,
			MaxIdleConnsPerHost: 32, ForceAttemptHTTP2: false, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
		hc := &http.Client{Transport: tr}
		lines := readLines(*tokens)
		for i := *from; i < *from+*n && i < len(lines); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				again("ws", i, func() error { return wsHold(hc, *url, lines[i], i, &up, got) })
			}()
			if i%100 == 99 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	go func() {
		for range time.Tick(2 * time.Second) {
			fmt.Fprintf(os.Stderr, "up %d ended %d\n", up.Load(), ended.Load())
		}
	}()
	wg.Wait()
}

// errDialed marks an error after the connection was up: not retried.
type errDialed struct{ error }

// retry runs hold again while its connection could not be set up (a
// loaded server may drop handshakes), at most 20 times, 1–3 s apart.
func retry(hold func() error) error {
	var err error
	for range 20 {
		if err = hold(); err == nil {
			return nil
		}
		if _, up := err.(errDialed); up {
			return err
		}
		time.Sleep(time.Second + time.Duration(rand.Int64N(int64(2*time.Second))))
	}
	return err
}

func readLines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	return strings.Fields(string(b))
}

// wsHold holds one device's WebSocket; on "push" it pushes and reports
// when the answer carries a command.
func wsHold(hc *http.Client, base, token string, i int, up *atomic.Int64, got func(int)) error {
	ctx := context.Background()
	wsURL := "wss://" + strings.TrimPrefix(base, "https://") + "/api/v1/connect"
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		return err
	}
	up.Add(1)
	seq := 1000
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			return errDialed{err}
		}
		if !bytes.Contains(msg, []byte(`"push"`)) {
			continue
		}
		seq++
		req, _ := http.NewRequest("POST", base+"/api/v1/push", strings.NewReader(fmt.Sprintf(`{"seq":%d,"state":{}}`, seq)))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			log.Printf("push %d: %v", i, err)
			continue
		}
		var ans struct{ Commands []json.RawMessage }
		json.NewDecoder(resp.Body).Decode(&ans)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if len(ans.Commands) > 0 {
			got(i)
		}
	}
}

// mqttHold holds one MQTT 3.1.1 client subscribed to d/<i> (QoS 0) and
// reports every message.
func mqttHold(d *net.Dialer, tc *tls.Config, broker string, i int, up *atomic.Int64, got func(int)) error {
	var c net.Conn
	var err error
	if tc != nil {
		c, err = tls.DialWithDialer(d, "tcp", broker, tc)
	} else {
		c, err = d.Dial("tcp", broker)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	id := fmt.Sprintf("c%d", i)
	// CONNECT: protocol MQTT level 4, clean session, keepalive 600 s.
	vh := append(mqttString("MQTT"), 4, 0x02, 0x02, 0x58)
	c.Write(mqttPacket(0x10, append(vh, mqttString(id)...)))
	r := bufio.NewReader(c)
	if typ, _, err := mqttRead(r); err != nil || typ != 0x20 {
		return fmt.Errorf("no CONNACK: %x %v", typ, err)
	}
	topic := fmt.Sprintf("d/%d", i)
	c.Write(mqttPacket(0x82, append([]byte{0, 1}, append(mqttString(topic), 0)...)))
	if typ, _, err := mqttRead(r); err != nil || typ != 0x90 {
		return fmt.Errorf("no SUBACK: %x %v", typ, err)
	}
	up.Add(1)
	for {
		typ, _, err := mqttRead(r)
		if err != nil {
			return errDialed{err}
		}
		if typ&0xf0 == 0x30 {
			got(i)
		}
	}
}

func mqttString(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

func mqttPacket(typ byte, body []byte) []byte {
	p := []byte{typ}
	n := len(body)
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		p = append(p, b)
		if n == 0 {
			break
		}
	}
	return append(p, body...)
}

func mqttRead(r *bufio.Reader) (byte, []byte, error) {
	typ, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, mul := 0, 1
	for {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n += int(b&0x7f) * mul
		mul *= 128
		if b&0x80 == 0 {
			break
		}
	}
	body := make([]byte, n)
	_, err = io.ReadFull(r, body)
	return typ, body, err
}
