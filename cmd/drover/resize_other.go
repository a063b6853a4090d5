//go:build !unix

package main

// onResize: no window change signal here.
func onResize(func()) (stop func()) { return func() {} }
