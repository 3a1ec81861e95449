//go:build !linux

package lease

func defaultOwnerClock() Clock { return SystemClock{} }
