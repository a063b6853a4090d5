package perf

import "math"

// The methodology page's formulas, each checked against the seed reports'
// own numbers in formulas_test.go. Inputs are raw measurements; rounding
// for display is the renderer's business, except where a formula yields a
// number of devices.

// eps absorbs float error in products that are whole in decimal
// (125.53 × 200 must give 25,106, not 25,105.999…).
const eps = 1e-6

// EstimatedPushes is devices × minutes × 60 / loop time.
func EstimatedPushes(devices int, minutes float64, loopTime float64) float64 {
	if loopTime <= 0 {
		return 0
	}
	return float64(devices) * minutes * 60 / loopTime
}

// EstimatedReqPerSec is devices / loop time.
func EstimatedReqPerSec(devices int, loopTime float64) float64 {
	if loopTime <= 0 {
		return 0
	}
	return float64(devices) / loopTime
}

// RoughReqPerSec is performed pushes / total time in seconds.
func RoughReqPerSec(performed int64, totalSec float64) float64 {
	if totalSec <= 0 {
		return 0
	}
	return float64(performed) / totalSec
}

// ProcessedLoops is performed pushes / devices: how many times the fleet
// pushed on average.
func ProcessedLoops(performed int64, devices int) float64 {
	if devices <= 0 {
		return 0
	}
	return float64(performed) / float64(devices)
}

// RealLoopTime is total time / processed loops.
func RealLoopTime(totalSec, loops float64) float64 {
	if loops <= 0 {
		return 0
	}
	return totalSec / loops
}

// PushErrorPct is error-or-retried pushes / performed pushes, in percent.
func PushErrorPct(errOrRetried, performed int64) float64 {
	if performed <= 0 {
		return 0
	}
	return float64(errOrRetried) / float64(performed) * 100
}

// RSSIncrease is RSS after − RSS before, in the unit given.
func RSSIncrease(before, after float64) float64 { return after - before }

// RSSIncreasePct is the increase / before, in percent.
func RSSIncreasePct(before, after float64) float64 {
	if before <= 0 {
		return 0
	}
	return (after - before) / before * 100
}

// PerDevice is an amount (e.g. the RSS increase in MiB or KiB) / devices.
func PerDevice(amount float64, devices int) float64 {
	if devices <= 0 {
		return 0
	}
	return amount / float64(devices)
}

// RAMUtilisationPct is OS used memory after the test / RAM, in percent.
func RAMUtilisationPct(usedAfter, ram float64) float64 {
	if ram <= 0 {
		return 0
	}
	return usedAfter / ram * 100
}

// MaxSafeDevices is devices / RAM utilisation, rounded to the nearest
// device as the reports do (3000 / 0.328125 = 9,142.9 → 9,143).
func MaxSafeDevices(devices int, ramUtilPct float64) int {
	if ramUtilPct <= 0 {
		return 0
	}
	return int(math.Round(float64(devices) / (ramUtilPct / 100)))
}

// LoadPerCore is the 15-minute load average / cores.
func LoadPerCore(load15 float64, cores int) float64 {
	if cores <= 0 {
		return 0
	}
	return load15 / float64(cores)
}

// PushesPerSec is pushes / elapsed seconds (a benchmark: devices × loops /
// elapsed).
func PushesPerSec(pushes int64, elapsedSec float64) float64 {
	if elapsedSec <= 0 {
		return 0
	}
	return float64(pushes) / elapsedSec
}

// IdealMaxDevices is pushes/s × loop time, whole devices (floor:
// 142.4096 × 260 = 37,026.5 → 37,026).
func IdealMaxDevices(pushesPerSec, loopTime float64) int {
	return int(math.Floor(pushesPerSec*loopTime + eps))
}

// RecommendedMax is pct % of the ideal, rounded to the nearest device
// (80 % of 25,106 = 20,084.8 → 20,085).
func RecommendedMax(ideal int, pct float64) int {
	return int(math.Round(float64(ideal) * pct / 100))
}

// PctOfPrevious is value / previous × 100 (the version comparison).
func PctOfPrevious(value, previous float64) float64 {
	if previous == 0 {
		return 0
	}
	return value / previous * 100
}

// SizingRule is how a benchmark turns throughput into a device count.
type SizingRule struct {
	Name string  `json:"name"`
	Pct  float64 `json:"pct"` // share of the ideal that is safe
	Text string  `json:"text"`
}

// The two rules of the reports.
var (
	Rule060 = SizingRule{Name: "0.6.0", Pct: 20, Text: "recommended max = 20 % of ideal (MAMAS 0.6.0)"}
	Rule080 = SizingRule{Name: "0.8.0", Pct: 80, Text: "safe max = 80 % of ideal, ideal from the lowest SSL throughput measured on this environment (Dwarfguard 0.8.0)"}
)
