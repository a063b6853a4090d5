package web

import (
	"fmt"
	"html/template"
	"time"

	"github.com/drover/drover/internal/fleet"
	"github.com/drover/drover/internal/render"
)

// point is one chart value at a time (unix ms).
type point struct {
	t int64
	v float64
}

type series struct {
	name   string
	points []point
}

// chart renders a line chart of ss over [from, to] (render.Chart: inline
// SVG, no script, no inline style; colours come from the stylesheet through
// classes).
func chart(title string, from, to time.Time, ss []series, format func(float64) string) template.HTML {
	layout := "15:04"
	if to.Sub(from) > 24*time.Hour {
		layout = "Jan 2 15:04"
	}
	at := func(ms float64) string { return time.UnixMilli(int64(ms)).UTC().Format(layout) }
	c := render.Chart{
		Title: title, XRange: &[2]float64{float64(from.UnixMilli()), float64(to.UnixMilli())},
		XTicks: render.EvenTicks(4, at), YFormat: format, Thin: true, NoData: "no data in this period",
		Last: func(name string, x, y float64) string {
			return name + ": " + format(y) + " at " + time.UnixMilli(int64(x)).UTC().Format("2006-01-02 15:04:05")
		},
	}
	for _, s := range ss {
		rs := render.Series{Name: s.name, X: make([]float64, len(s.points)), Y: make([]float64, len(s.points))}
		for i, p := range s.points {
			rs.X[i], rs.Y[i] = float64(p.t), p.v
		}
		c.Series = append(c.Series, rs)
	}
	return template.HTML(c.SVG()) // built from escaped parts
}

// deviceCharts turns history samples into the device page's charts.
func deviceCharts(samples []fleet.Sample, from, to time.Time) []template.HTML {
	var cpu, temp, rssi, rsrp, sinr, rx, tx []point
	for i, s := range samples {
		t := s.At.UnixMilli()
		add := func(dst *[]point, v *float64) {
			if v != nil {
				*dst = append(*dst, point{t, *v})
			}
		}
		add(&cpu, s.CPU)
		add(&temp, s.Temperature)
		add(&rssi, s.RSSI)
		add(&rsrp, s.RSRP)
		add(&sinr, s.SINR)
		if i > 0 {
			p := samples[i-1]
			dt := s.At.Sub(p.At).Seconds()
			if dt > 0 {
				if s.RxBytes != nil && p.RxBytes != nil && *s.RxBytes >= *p.RxBytes {
					rx = append(rx, point{t, float64(*s.RxBytes-*p.RxBytes) * 8 / dt})
				}
				if s.TxBytes != nil && p.TxBytes != nil && *s.TxBytes >= *p.TxBytes {
					tx = append(tx, point{t, float64(*s.TxBytes-*p.TxBytes) * 8 / dt})
				}
			}
		}
	}
	unit := func(u string, prec int) func(float64) string {
		return func(v float64) string { return fmt.Sprintf("%.*f%s", prec, v, u) }
	}
	return []template.HTML{
		chart("CPU (%)", from, to, []series{{"CPU", cpu}}, unit(" %", 0)),
		chart("Temperature (°C)", from, to, []series{{"temperature", temp}}, unit(" °C", 1)),
		chart("Traffic (bit/s, all interfaces)", from, to, []series{{"received", rx}, {"sent", tx}}, bitRate),
		chart("Signal", from, to, []series{{"RSSI dBm", rssi}, {"RSRP dBm", rsrp}, {"SINR dB", sinr}}, unit("", 0)),
	}
}

func bitRate(v float64) string { return render.SI(v, []string{"bit/s", "kbit/s", "Mbit/s", "Gbit/s"}) }
