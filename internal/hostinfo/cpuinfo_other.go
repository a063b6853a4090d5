//go:build !linux

package hostinfo

import "errors"

// ReadCPUInfo: /proc/cpuinfo is Linux only; elsewhere ReadHost counts
// runtime.NumCPU.
func ReadCPUInfo() (CPUInfo, error) {
	return CPUInfo{}, errors.New("cpuinfo: not on Linux")
}
