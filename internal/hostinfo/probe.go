package hostinfo

import (
	"encoding/json"
	"time"
)

// probeState is the work of ProbeCPU: a device state as agents push it.
type probeState struct {
	Uptime      int64             `json:"uptime"`
	CPU         float64           `json:"cpu"`
	MemTotal    int64             `json:"mem_total"`
	MemUsed     int64             `json:"mem_used"`
	Temperature float64           `json:"temperature"`
	Firmware    string            `json:"firmware"`
	Interfaces  []probeInterface  `json:"interfaces"`
	Extra       map[string]string `json:"extra"`
}

type probeInterface struct {
	Name    string `json:"name"`
	RxBytes uint64 `json:"rx_bytes"`
	TxBytes uint64 `json:"tx_bytes"`
}

// ProbeCPU times a fixed piece of single-threaded work, a JSON round trip
// (encoding/json) of a device state, and returns the fastest of three
// rounds of probeRounds round trips, per round trip. On one machine it
// moves with what the machine gives a thread that day (another VM on the
// host, the clock), so results of different runs can be set side by side.
// It takes about 100 ms on a current server core.
func ProbeCPU() time.Duration {
	const probeRounds = 2000
	in := probeState{Uptime: 86400, CPU: 12.5, MemTotal: 268435456, MemUsed: 98304000, Temperature: 47.5, Firmware: "6.3.5",
		Interfaces: []probeInterface{{"eth0", 1234567, 7654321}, {"eth1", 0, 0}, {"wwan0", 987654321, 123456789}},
		Extra:      map[string]string{"iccid": "8942031019123456789", "imei": "356938035643809", "apn": "internet"}}
	best := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		for i := range probeRounds {
			in.Uptime = int64(i)
			b, err := json.Marshal(&in)
			if err != nil {
				panic(err) // a fixed value of fixed types
			}
			var out probeState
			if err := json.Unmarshal(b, &out); err != nil || out.Uptime != in.Uptime {
				panic("hostinfo: the CPU probe's round trip changed its value")
			}
		}
		best = min(best, time.Since(start)/probeRounds)
	}
	return best
}
