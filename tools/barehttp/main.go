// Command barehttp is the reference point of the benchmarks: a bare Go
// net/http server answering every request with a small 200 JSON body, over
// HTTP and HTTPS (the certificate and key given as flags). A POST to
// /api/v1/register gets a registration answer with a made-up token, so the
// emulator can run against it (scripts/bench-emulator-cpu.sh).
package main

import (
	"crypto/tls"
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
)

func main() {
	httpAddr := flag.String("http", "127.0.0.1:0", "plain HTTP address")
	httpsAddr := flag.String("https", "", "HTTPS address (needs -cert and -key)")
	cert := flag.String("cert", "", "PEM certificate")
	key := flag.String("key", "", "PEM key")
	flag.Parse()
	var devices atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost && r.URL.Path == "/api/v1/register" {
			n := strconv.FormatInt(devices.Add(1), 10)
			w.Write([]byte(`{"device_id":"d` + n + `","token":"t` + n + `","push_interval":200,"new":true}` + "\n"))
			return
		}
		w.Write([]byte(`{"push_interval":200}` + "\n"))
	})
	if *httpsAddr != "" {
		go func() {
			srv := &http.Server{Addr: *httpsAddr, Handler: h}
			srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
			log.Fatal(srv.ListenAndServeTLS(*cert, *key))
		}()
	}
	log.Fatal(http.ListenAndServe(*httpAddr, h))
}
