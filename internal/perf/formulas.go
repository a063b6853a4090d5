package perf

import "math"

// The methodology page's formulas, each checked against the seed reports'
// own numbers in formulas_test.go. Inputs are raw measurements; rounding
// for display is the renderer's business, except where a formula yields a
// number of devices.

// eps absorbs float error in products that are whole in decimal
// (125.53 × 200 must give 25,106, not 25,105.999…).
const eps = 1e-6

// estimatedPushes is devices × minutes × 60 / loop time.
func estimatedPushes(devices int, minutes float64, loopTime float64) float64 {
	if loopTime <= 0 {
		return 0
	}
	return float64(devices) * minutes * 60 / loopTime
}

// estimatedReqPerSec is devices / loop time.
func estimatedReqPerSec(devices int, loopTime float64) float64 {
	if loopTime <= 0 {
		return 0
	}
	return float64(devices) / loopTime
}

// roughReqPerSec is performed pushes / total time in seconds.
func roughReqPerSec(performed int64, totalSec float64) float64 {
	if totalSec <= 0 {
		return 0
	}
	return float64(performed) / totalSec
}

// processedLoops is performed pushes / devices: how many times the fleet
// pushed on average.
func processedLoops(performed int64, devices int) float64 {
	if devices <= 0 {
		return 0
	}
	return float64(performed) / float64(devices)
}

// realLoopTime is total time / processed loops.
func realLoopTime(totalSec, loops float64) float64 {
	if loops <= 0 {
		return 0
	}
	return totalSec / loops
}

// pushErrorPct is error-or-retried pushes / performed pushes, in percent.
func pushErrorPct(errOrRetried, performed int64) float64 {
	if performed <= 0 {
		return 0
	}
	return float64(errOrRetried) / float64(performed) * 100
}

// rssIncrease is RSS after − RSS before, in the unit given.
func rssIncrease(before, after float64) float64 { return after - before }

// rssIncreasePct is the increase / before, in percent.
func rssIncreasePct(before, after float64) float64 {
	if before <= 0 {
		return 0
	}
	return (after - before) / before * 100
}

// perDevice is an amount (e.g. the RSS increase in MiB or KiB) / devices.
func perDevice(amount float64, devices int) float64 {
	if devices <= 0 {
		return 0
	}
	return amount / float64(devices)
}

// ramUtilisationPct is OS used memory after the test / RAM, in percent.
func ramUtilisationPct(usedAfter, ram float64) float64 {
	if ram <= 0 {
		return 0
	}
	return usedAfter / ram * 100
}

// maxSafeDevices is devices / RAM utilisation, rounded to the nearest
// device as the reports do (3000 / 0.328125 = 9,142.9 → 9,143).
func maxSafeDevices(devices int, ramUtilPct float64) int {
	if ramUtilPct <= 0 {
		return 0
	}
	return int(math.Round(float64(devices) / (ramUtilPct / 100)))
}

// loadPerCore is the 15-minute load average / cores.
func loadPerCore(load15 float64, cores int) float64 {
	if cores <= 0 {
		return 0
	}
	return load15 / float64(cores)
}

// pushesPerSec is pushes / elapsed seconds (a benchmark: devices × loops /
// elapsed).
func pushesPerSec(pushes int64, elapsedSec float64) float64 {
	if elapsedSec <= 0 {
		return 0
	}
	return float64(pushes) / elapsedSec
}

// idealMaxDevices is pushes/s × loop time, whole devices (floor:
// 142.4096 × 260 = 37,026.5 → 37,026).
func idealMaxDevices(pushesPerSec, loopTime float64) int {
	return int(math.Floor(pushesPerSec*loopTime + eps))
}

// recommendedMax is pct % of the ideal, rounded to the nearest device
// (80 % of 25,106 = 20,084.8 → 20,085).
func recommendedMax(ideal int, pct float64) int {
	return int(math.Round(float64(ideal) * pct / 100))
}

// pctOfPrevious is value / previous × 100 (the version comparison).
func pctOfPrevious(value, previous float64) float64 {
	if previous == 0 {
		return 0
	}
	return value / previous * 100
}

// sizingRule is how a benchmark turns throughput into a device count.
type sizingRule struct {
	Name string  `json:"name"`
	Pct  float64 `json:"pct"` // share of the ideal that is safe
	Text string  `json:"text"`
}

// The two rules of the reports.
var (
	rule060 = sizingRule{Name: "0.6.0", Pct: 20, Text: "recommended max = 20 % of ideal (MAMAS 0.6.0)"}
	rule080 = sizingRule{Name: "0.8.0", Pct: 80, Text: "safe max = 80 % of ideal, ideal from the lowest SSL throughput measured on this environment (Dwarfguard 0.8.0)"}
)
