package hostinfo

// ReadCPUInfo reads /proc/cpuinfo: the model, the logical CPUs and the
// physical cores (distinct physical id and core id pairs; without that
// topology, as in some VMs and on ARM, cores = threads).
func ReadCPUInfo() (CPUInfo, error) {
	var c CPUInfo
	fs, err := procFS()
	if err != nil {
		return c, err
	}
	cpus, err := fs.CPUInfo() // /proc/cpuinfo is Linux only
	if err != nil {
		return c, err
	}
	cores := map[string]bool{}
	for _, p := range cpus {
		c.Threads++
		if c.Model == "" {
			c.Model = p.ModelName
		}
		if p.CoreID != "" {
			cores[p.PhysicalID+"/"+p.CoreID] = true
		}
	}
	c.Cores = len(cores)
	if c.Cores == 0 || c.Cores > c.Threads {
		c.Cores = c.Threads
	}
	return c, nil
}
