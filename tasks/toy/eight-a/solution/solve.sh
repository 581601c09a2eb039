#!/bin/bash
printf aaaaaaaa > /app/answer.txt
