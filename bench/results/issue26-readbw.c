/* One-thread read bandwidth of 1 GiB on this machine (issue 26 item 1, bench/README):
 *   gcc -O2 -march=native -o readbw bench/results/issue26-readbw.c && ./readbw
 * 2026-12-03, the 2-core VM: "read 1 GiB: best 0.055 s cpu, 19.5 GB/s". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(void){size_t n=(size_t)1<<27;uint64_t*a=malloc(n*8);memset(a,1,n*8);double best=1e9;uint64_t s=0;
for(int r=0;r<5;r++){double t=now();for(size_t i=0;i<n;i+=8){s+=a[i]^a[i+1]^a[i+2]^a[i+3]^a[i+4]^a[i+5]^a[i+6]^a[i+7];}t=now()-t;if(t<best)best=t;}
printf("read 1 GiB: best %.3f s cpu, %.1f GB/s (%llu)\n",best,n*8/best/1e9,(unsigned long long)s);}
