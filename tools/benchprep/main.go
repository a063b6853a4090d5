// Command benchprep registers N devices with a Drover server, pushes one
// state for each, and writes their tokens one per line: the input of the wrk
// push script (scripts/wrk/push.lua) and of the RSS-per-device measurement.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "https://127.0.0.1:8443", "server base URL")
	secret := flag.String("secret", "", "enrollment secret")
	n := flag.Int("n", 10000, "devices")
	out := flag.String("out", "tokens.txt", "token file")
	prefix := flag.String("prefix", "bench", "machine ID prefix")
	workers := flag.Int("workers", 32, "concurrent requests")
	flag.Parse()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: *workers}
	c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	tokens := make([]string, *n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	post := func(path, token string, body []byte, into any) error {
		for attempt := 0; ; attempt++ {
			req, _ := http.NewRequest("POST", *url+path, bytes.NewReader(body))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 503 && attempt < 20 {
				time.Sleep(time.Second)
				continue
			}
			if resp.StatusCode != 200 {
				return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
			}
			return json.Unmarshal(b, into)
		}
	}
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= *n {
					return
				}
				var reg struct{ Token string }
				body := fmt.Sprintf(`{"machine_id":"%s-%08d","device_type":"ICR-3241","model":"ICR-3241W","firmware":"6.3.5","serial":"ACZ%08d","enrollment_secret":%q}`, *prefix, i, i, *secret)
				if err := post("/api/v1/register", "", []byte(body), &reg); err != nil {
					log.Fatal(err)
				}
				tokens[i] = reg.Token
				var ans map[string]any
				if err := post("/api/v1/push", reg.Token, []byte(fmt.Sprintf(pushBody, i)), &ans); err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, t := range tokens {
		fmt.Fprintln(w, t)
	}
	if err := w.Flush(); err != nil {
		log.Fatal(err)
	}
	f.Close()
	log.Printf("registered and pushed %d devices in %s", *n, time.Since(start).Round(time.Millisecond))
}

// pushBody is a realistic cellular router state (about 600 bytes).
const pushBody = `{"seq":1,"config_version":0,"state":{"uptime":%d,"cpu":12.5,"load1":0.31,"mem_total":268435456,"mem_used":98304000,"disk_total":134217728,"disk_used":41943040,"temperature":47.5,"firmware":"6.3.5","interfaces":[{"name":"eth0","rx_bytes":1234567,"tx_bytes":7654321,"rx_packets":9876,"tx_packets":8765},{"name":"eth1","rx_bytes":0,"tx_bytes":0},{"name":"wwan0","rx_bytes":987654321,"tx_bytes":123456789,"rx_packets":765432,"tx_packets":654321}],"signal":{"rssi":-67,"rsrp":-95,"rsrq":-10,"sinr":12.4,"operator":"Vodafone CZ","technology":"LTE"},"extra":{"iccid":"8942031019123456789","imei":"356938035643809","apn":"internet"}}}`
