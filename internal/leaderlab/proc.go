package leaderlab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a replica subprocess seen from the lab.
type proc struct {
	id    string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu     sync.Mutex
	events []Event
	change chan struct{} // closed and replaced on every event
	exited chan struct{}
	err    error
}

// startProc starts exe as a replica with spec, prefixed by wrap (e.g.
// ip netns exec ns). Its stderr goes to logw.
func startProc(exe string, wrap []string, spec ReplicaSpec, logw io.Writer) (*proc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	argv := append(append([]string{}, wrap...), exe)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), envReplica+"="+string(b))
	cmd.Stderr = logw
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{id: spec.ID, cmd: cmd, stdin: stdin, change: make(chan struct{}), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			p.mu.Lock()
			p.events = append(p.events, e)
			close(p.change)
			p.change = make(chan struct{})
			p.mu.Unlock()
		}
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		close(p.change)
		p.change = make(chan struct{})
		p.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// wait returns the first event named ev at or after since.
func (p *proc) wait(ctx context.Context, ev string, since time.Time, limit time.Duration) (Event, error) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for _, e := range p.events {
			if e.Ev == ev && !e.Time().Before(since) {
				p.mu.Unlock()
				return e, nil
			}
		}
		ch := p.change
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.exited:
			// One more pass over the events, then give up.
			p.mu.Lock()
			for _, e := range p.events {
				if e.Ev == ev && !e.Time().Before(since) {
					p.mu.Unlock()
					return e, nil
				}
			}
			err := p.err
			p.mu.Unlock()
			return Event{}, fmt.Errorf("replica %s exited (%v) before %q", p.id, err, ev)
		case <-deadline.C:
			return Event{}, fmt.Errorf("replica %s: no %q within %v", p.id, ev, limit)
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// eventsSince returns the events named ev at or after since.
func (p *proc) eventsSince(ev string, since time.Time) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Event
	for _, e := range p.events {
		if e.Ev == ev && !e.Time().Before(since) {
			out = append(out, e)
		}
	}
	return out
}

func (p *proc) signal(s syscall.Signal) error { return p.cmd.Process.Signal(s) }

func (p *proc) send(line string) error {
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

// waitExit waits for the process to end, up to limit.
func (p *proc) waitExit(limit time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(limit):
		return false
	}
}

// kill ends the process (SIGCONT first, in case it is stopped) and waits.
func (p *proc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	<-p.exited
}
