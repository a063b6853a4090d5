// Command barehttp is the reference point of the benchmarks: a bare Go
// net/http server answering every request with a small 200 JSON body, over
// HTTP and HTTPS (the certificate and key given as flags). A POST to
// /api/v1/register gets a registration answer with a made-up token, so the
// emulator can run against it (scripts/bench-emulator-cpu.sh). With
// -fasthttps the same answers come over HTTPS from a fasthttp server too
// (github.com/valyala/fasthttp over crypto/tls), the reference for what
// another HTTP stack would give Drover's pushes (docs/performance.md).
package main

import (
	"crypto/tls"
	"flag"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

func main() {
	httpAddr := flag.String("http", "127.0.0.1:0", "plain HTTP address")
	httpsAddr := flag.String("https", "", "HTTPS address (needs -cert and -key)")
	cert := flag.String("cert", "", "PEM certificate")
	key := flag.String("key", "", "PEM key")
	fastAddr := flag.String("fasthttps", "", "HTTPS address served by fasthttp (needs -cert and -key)")
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
	if *fastAddr != "" {
		go serveFast(*fastAddr, *cert, *key, &devices)
	}
	log.Fatal(http.ListenAndServe(*httpAddr, h))
}

// serveFast answers as h does, from fasthttp, reading every body as a push
// handler must.
func serveFast(addr, certFile, keyFile string, devices *atomic.Int64) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		_ = ctx.PostBody()
		ctx.SetContentType("application/json")
		if ctx.IsPost() && string(ctx.Path()) == "/api/v1/register" {
			n := strconv.FormatInt(devices.Add(1), 10)
			ctx.SetBodyString(`{"device_id":"d` + n + `","token":"t` + n + `","push_interval":200,"new":true}` + "\n")
			return
		}
		ctx.SetBodyString(`{"push_interval":200}` + "\n")
	}}
	log.Fatal(srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})))
}
